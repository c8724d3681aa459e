//! Conformance of the running server to docs/api/openapi.json: every
//! documented path and method is sent valid and invalid requests against a
//! real fleet (KVM); every status must be documented for the operation and
//! every body must validate against the documented schema (a validator for
//! the JSON Schema subset the document uses, below).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hqdmux_tests::{config, scratch_dir};
use serde_json::{json, Value};
use vmm::kvm_or_skip;

fn doc() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/api/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn resolve<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    match s["$ref"].as_str() {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").expect("local $ref");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => s,
    }
}

/// Validates `v` against schema `s` (OpenAPI 3.0 subset: $ref, type,
/// nullable, enum, properties, required, additionalProperties, items,
/// minimum, maximum, minLength, maxLength, minProperties). Errors name the
/// JSON path.
fn validate(doc: &Value, s: &Value, v: &Value, at: &str) -> Result<(), String> {
    let s = resolve(doc, s);
    if v.is_null() {
        return if s["nullable"] == true || s.get("type").is_none() {
            Ok(())
        } else {
            Err(format!("{at}: null but not nullable"))
        };
    }
    if let Some(e) = s["enum"].as_array() {
        if !e.contains(v) {
            return Err(format!("{at}: {v} not in {e:?}"));
        }
    }
    let ok = match s["type"].as_str() {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some(t) => {
            return Err(format!(
                "{at}: schema type {t} not supported by this validator"
            ))
        }
    };
    if !ok {
        return Err(format!("{at}: {v} is not of type {}", s["type"]));
    }
    if let Some(x) = v.as_f64() {
        if s["minimum"].as_f64().is_some_and(|m| x < m) {
            return Err(format!("{at}: {x} below minimum {}", s["minimum"]));
        }
        if s["maximum"].as_f64().is_some_and(|m| x > m) {
            return Err(format!("{at}: {x} above maximum {}", s["maximum"]));
        }
    }
    if let Some(t) = v.as_str() {
        let n = t.chars().count() as u64;
        if s["minLength"].as_u64().is_some_and(|m| n < m)
            || s["maxLength"].as_u64().is_some_and(|m| n > m)
        {
            return Err(format!("{at}: length {n} out of bounds"));
        }
    }
    if let Some(a) = v.as_array() {
        for (i, x) in a.iter().enumerate() {
            validate(doc, &s["items"], x, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(o) = v.as_object() {
        if s["minProperties"]
            .as_u64()
            .is_some_and(|m| (o.len() as u64) < m)
        {
            return Err(format!(
                "{at}: fewer than {} properties",
                s["minProperties"]
            ));
        }
        for r in s["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap();
            if !o.contains_key(r) {
                return Err(format!("{at}: missing required {r}"));
            }
        }
        for (k, x) in o {
            match s["properties"].get(k) {
                Some(ps) => validate(doc, ps, x, &format!("{at}.{k}"))?,
                None => match &s["additionalProperties"] {
                    Value::Bool(false) => return Err(format!("{at}: undocumented property {k}")),
                    Value::Object(_) => {
                        validate(doc, &s["additionalProperties"], x, &format!("{at}.{k}"))?
                    }
                    _ => {}
                },
            }
        }
    }
    Ok(())
}

#[test]
fn the_validator_refuses_what_the_schemas_refuse() {
    let d = doc();
    let vm = json!({"$ref": "#/components/schemas/Vm"});
    assert!(validate(
        &d,
        &json!({"$ref": "#/components/schemas/Error"}),
        &json!({"error": "x"}),
        "$"
    )
    .is_ok());
    assert!(validate(
        &d,
        &json!({"$ref": "#/components/schemas/Error"}),
        &json!({"error": 1}),
        "$"
    )
    .is_err());
    assert!(validate(
        &d,
        &json!({"$ref": "#/components/schemas/Error"}),
        &json!({}),
        "$"
    )
    .is_err());
    assert!(validate(&d, &vm, &json!({"name": "a"}), "$")
        .unwrap_err()
        .contains("missing required"));
    let p = json!({"$ref": "#/components/schemas/Policy"});
    assert!(validate(
        &d,
        &p,
        &json!({"policy": "fifo", "policies": ["fifo"]}),
        "$"
    )
    .is_ok());
    assert!(validate(&d, &p, &json!({"policy": "lottery", "policies": []}), "$").is_err());
    assert!(validate(
        &d,
        &p,
        &json!({"policy": "fifo", "policies": [], "x": 1}),
        "$"
    )
    .is_err());
    let patch = json!({"$ref": "#/components/schemas/VmPatch"});
    assert!(validate(&d, &patch, &json!({"priority": 16}), "$").is_err());
    assert!(validate(&d, &patch, &json!({"quantum_ms": null}), "$").is_ok());
}

/// One request; status and JSON body.
fn call(sock: &Path, method: &str, path: &str, ct: Option<&str>, body: &str) -> (u16, Value) {
    let b = (!body.is_empty() || ct.is_some())
        .then(|| (ct.unwrap_or("application/json"), body.as_bytes()));
    let (st, out) = vmm::http::call(sock, method, path, b).expect("API reachable");
    (st, serde_json::from_slice(&out).unwrap_or(Value::Null))
}

/// A GET over a fresh connection: status, Content-Type (without
/// parameters) and body.
fn get_raw(sock: &Path, path: &str) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).expect("API reachable");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: hqdmux\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head.split(' ').nth(1).and_then(|x| x.parse().ok()).unwrap();
    let ct = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.split(';').next().unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    (status, ct, buf[end + 4..].to_vec())
}

/// (method, path template, concrete path, content type, body, expected status)
type Case<'a> = (&'a str, &'a str, String, Option<&'a str>, String, u16);

#[test]
fn the_server_conforms_to_its_openapi_document() {
    if !kvm_or_skip("the_server_conforms_to_its_openapi_document") {
        return;
    }
    let d = doc();
    let dir = scratch_dir("api-openapi");
    let sock = dir.join("api.sock");
    let toml = "[[vm]]\nname = \"gpuvm\"\nimage = \"builtin:gpu\"\nmemory_mib = 256\ngpu = true\n\
                args = \"kernels=1 wgs=304 cost_us=200000 loops=100000\"\n\
                [[vm]]\nname = \"idle\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n\
                [[vm]]\nname = \"idle2\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n";
    let cfg = config(&dir, toml);
    let opts = vmm::fleet::RunOptions {
        api_socket: Some(sock.clone()),
        ..Default::default()
    };
    let fleet = std::thread::spawn(move || vmm::fleet::run_fleet(&cfg, opts).expect("fleet"));
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no API socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    // (method, path template, concrete path, content type, body, expected status)
    let j = Some("application/json");
    let cases: Vec<Case> = vec![
        (
            "get",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            None,
            "".into(),
            200,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            j,
            json!({"name": "added", "image": "builtin:fault", "args": "mode=hang"}).to_string(),
            201,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            Some("application/toml"),
            "[[vm]]\nname = \"added2\"\nimage = \"builtin:fault\"\nargs = \"mode=hang\"\n".into(),
            201,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            j,
            json!({"name": "added", "image": "builtin:hello"}).to_string(),
            409,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            j,
            json!({"name": "x", "image": "builtin:hello", "colour": 1}).to_string(),
            422,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            j,
            "[".into(),
            400,
        ),
        (
            "post",
            "/api/v1/vms",
            "/api/v1/vms".into(),
            Some("image/png"),
            "x".into(),
            415,
        ),
        (
            "get",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            None,
            "".into(),
            200,
        ),
        (
            "get",
            "/api/v1/vms/{name}",
            "/api/v1/vms/nope".into(),
            None,
            "".into(),
            404,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"weight": 2, "quantum_ms": 5}).to_string(),
            200,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"quantum_ms": null}).to_string(),
            200,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"priority": 99}).to_string(),
            400,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({}).to_string(),
            400,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            "[1]".into(),
            400,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            Some("text/plain"),
            "{}".into(),
            415,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/nope".into(),
            j,
            json!({"weight": 2}).to_string(),
            404,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/idle".into(),
            j,
            json!({"weight": 2}).to_string(),
            409,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"preempt_timeout_ms": 100}).to_string(),
            200,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"preempt_timeout_ms": 0}).to_string(),
            400,
        ),
        (
            "post",
            "/api/v1/vms/{name}/pause",
            "/api/v1/vms/gpuvm/pause".into(),
            None,
            "".into(),
            200,
        ),
        (
            "post",
            "/api/v1/vms/{name}/pause",
            "/api/v1/vms/nope/pause".into(),
            None,
            "".into(),
            404,
        ),
        (
            "post",
            "/api/v1/vms/{name}/pause",
            "/api/v1/vms/idle/pause".into(),
            None,
            "".into(),
            409,
        ),
        (
            "post",
            "/api/v1/vms/{name}/resume",
            "/api/v1/vms/gpuvm/resume".into(),
            None,
            "".into(),
            200,
        ),
        (
            "post",
            "/api/v1/vms/{name}/resume",
            "/api/v1/vms/nope/resume".into(),
            None,
            "".into(),
            404,
        ),
        (
            "post",
            "/api/v1/vms/{name}/resume",
            "/api/v1/vms/idle/resume".into(),
            None,
            "".into(),
            409,
        ),
        (
            "post",
            "/api/v1/vms/{name}/stop",
            "/api/v1/vms/idle2/stop".into(),
            None,
            "".into(),
            200,
        ),
        (
            "post",
            "/api/v1/vms/{name}/stop",
            "/api/v1/vms/idle2/stop".into(),
            None,
            "".into(),
            200, // already stopped: idempotent
        ),
        (
            "post",
            "/api/v1/vms/{name}/stop",
            "/api/v1/vms/nope/stop".into(),
            None,
            "".into(),
            404,
        ),
        (
            "get",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            None,
            "".into(),
            200,
        ),
        (
            "put",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            j,
            json!({"policy": "timeslice"}).to_string(),
            200,
        ),
        (
            "put",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            j,
            json!({"policy": "hqdmux"}).to_string(),
            200,
        ),
        (
            "put",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            j,
            json!({"policy": "lottery"}).to_string(),
            400,
        ),
        (
            "put",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            j,
            json!({"policy": "fifo", "x": 1}).to_string(),
            400,
        ),
        (
            "put",
            "/api/v1/policy",
            "/api/v1/policy".into(),
            Some("text/plain"),
            "fifo".into(),
            415,
        ),
        (
            "get",
            "/api/v1/fleet",
            "/api/v1/fleet".into(),
            None,
            "".into(),
            200,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"guard": {"max_queue_errors": 5, "window_ms": 10000}}).to_string(),
            200,
        ),
        (
            "patch",
            "/api/v1/vms/{name}",
            "/api/v1/vms/gpuvm".into(),
            j,
            json!({"guard": {"window_ms": 0}}).to_string(),
            400,
        ),
        (
            "post",
            "/api/v1/vms/{name}/clear-quarantine",
            "/api/v1/vms/gpuvm/clear-quarantine".into(),
            None,
            "".into(),
            200,
        ),
        (
            "post",
            "/api/v1/vms/{name}/clear-quarantine",
            "/api/v1/vms/nope/clear-quarantine".into(),
            None,
            "".into(),
            404,
        ),
        (
            "post",
            "/api/v1/vms/{name}/clear-quarantine",
            "/api/v1/vms/idle/clear-quarantine".into(),
            None,
            "".into(),
            409,
        ),
        (
            "get",
            "/api/v1/timeline",
            "/api/v1/timeline?seconds=5".into(),
            None,
            "".into(),
            200,
        ),
        (
            "get",
            "/api/v1/timeline",
            "/api/v1/timeline?seconds=0".into(),
            None,
            "".into(),
            400,
        ),
        (
            "get",
            "/api/v1/timeline",
            "/api/v1/timeline?format=png".into(),
            None,
            "".into(),
            400,
        ),
    ];
    let mut covered = std::collections::BTreeSet::new();
    for (m, tpl, path, ct, body, want) in &cases {
        let op = &d["paths"][*tpl][*m];
        assert!(op.is_object(), "{m} {tpl} is documented");
        let (st, v) = call(&sock, &m.to_uppercase(), path, *ct, body);
        assert_eq!(st, *want, "{m} {path} {body}: {v}");
        let resp = &op["responses"][st.to_string()];
        assert!(resp.is_object(), "{m} {tpl}: status {st} is not documented");
        let schema = &resp["content"]["application/json"]["schema"];
        validate(&d, schema, &v, "$").unwrap_or_else(|e| panic!("{m} {path} -> {st}: {e}\n{v}"));
        if st < 300 {
            covered.insert((m.to_string(), tpl.to_string()));
        }
    }
    // Operations answered in another content type than JSON: the type is
    // documented for the status, and the body has that type's shape.
    for (tpl, path, want_ct) in [
        ("/metrics", "/metrics", "text/plain"),
        (
            "/api/v1/timeline",
            "/api/v1/timeline?seconds=120&format=svg",
            "image/svg+xml",
        ),
        ("/api/v1/timeline", "/api/v1/timeline", "application/json"),
    ] {
        let (st, ct, body) = get_raw(&sock, path);
        assert_eq!(st, 200, "GET {path}");
        assert_eq!(ct, want_ct, "GET {path}");
        let content = &d["paths"][tpl]["get"]["responses"]["200"]["content"];
        assert!(
            content[&ct].is_object(),
            "GET {tpl}: {ct} is not documented"
        );
        let text = String::from_utf8(body).expect("UTF-8");
        match want_ct {
            "text/plain" => assert!(
                text.lines().any(|l| l.starts_with("# TYPE hqdmux_")),
                "{text}"
            ),
            "image/svg+xml" => {
                let x = roxmltree::Document::parse(&text).expect("well-formed SVG");
                assert_eq!(x.root_element().tag_name().name(), "svg");
            }
            _ => {
                let v: Value = serde_json::from_str(&text).unwrap();
                validate(&d, &content[&ct]["schema"], &v, "$").unwrap();
            }
        }
        covered.insert(("get".to_string(), tpl.to_string()));
    }
    // Every documented operation was answered with a success at least once,
    // and every other method on a documented path gets 405.
    for (tpl, item) in d["paths"].as_object().unwrap() {
        for m in ["get", "put", "post", "patch", "delete"] {
            if item.get(m).is_some() {
                // The vGPU routes succeed under `hqdmux serve` only (here
                // `GET /vgpus` lists none, the others answer 409): they are
                // driven against a live `serve` in vmm/tests/vgpu_api.rs.
                if tpl.starts_with("/api/v1/vgpus") {
                    continue;
                }
                assert!(
                    covered.contains(&(m.to_string(), tpl.clone())),
                    "{m} {tpl} never succeeded"
                );
            } else {
                let path = tpl.replace("{name}", "gpuvm");
                let (st, v) = call(&sock, &m.to_uppercase(), &path, None, "");
                assert_eq!(st, 405, "{m} {path}: {v}");
                assert!(v["error"].is_string());
            }
        }
    }
    // Stop the rest through the API: the fleet ends.
    for vm in ["gpuvm", "idle", "added", "added2"] {
        let (st, v) = call(&sock, "POST", &format!("/api/v1/vms/{vm}/stop"), None, "");
        assert_eq!(st, 200, "{vm}: {v}");
    }
    let report = fleet.join().unwrap();
    assert_eq!(report.vms.len(), 5);
    assert!(!sock.exists());
    std::fs::remove_dir_all(&dir).ok();
}
