//! `--log-format json`: one JSON object per log line on stderr, for log
//! collectors (journald's JSON export, Loki, Elasticsearch):
//!
//! ```json
//! {"ts":"2026-11-27T03:00:00.123456Z","level":"INFO","target":"vmm::serve","msg":"vgpu 'a': serving ...","vm":"a"}
//! ```
//!
//! `ts` is UTC (RFC 3339, microseconds), `level` is `ERROR`, `WARN`,
//! `INFO`, `DEBUG` or `TRACE`, `target` the module that logged, `msg` the
//! text, and `vm` the VM (or vGPU) the line is about when the text names one
//! the way hqdmux's log lines do (`vm 'NAME'`, `vgpu 'NAME'`, or a leading
//! `vm NAME:`); absent otherwise.

use std::io::Write;

/// How log lines are written on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Text lines: [ts LEVEL target] msg
    #[default]
    Text,
    /// One JSON object per line: ts, level, target, msg, vm
    Json,
}

/// The VM a log message is about, if it names one: the first `vm 'NAME'`
/// or `vgpu 'NAME'`, else a leading `vm NAME:`.
pub fn vm_of(msg: &str) -> Option<&str> {
    for pre in ["vm '", "vgpu '"] {
        if let Some(i) = msg.find(pre) {
            let rest = &msg[i + pre.len()..];
            if let Some(end) = rest.find('\'') {
                return Some(&rest[..end]);
            }
        }
    }
    let rest = msg.strip_prefix("vm ")?;
    let (name, _) = rest.split_once(':')?;
    (!name.is_empty() && !name.contains(char::is_whitespace)).then_some(name)
}

/// One log line as a JSON object (no line feed).
pub fn json_line(ts: &str, level: log::Level, target: &str, msg: &str) -> String {
    let mut o = serde_json::Map::new();
    o.insert("ts".into(), ts.into());
    o.insert("level".into(), level.as_str().into());
    o.insert("target".into(), target.into());
    o.insert("msg".into(), msg.into());
    if let Some(vm) = vm_of(msg) {
        o.insert("vm".into(), vm.into());
    }
    serde_json::Value::Object(o).to_string()
}

/// Starts the logger on stderr: `RUST_LOG` filters (default `info`),
/// `format` shapes each line.
pub fn init(format: LogFormat) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if format == LogFormat::Json {
        b.format(|buf, r| {
            let ts = buf.timestamp_micros().to_string();
            let line = json_line(&ts, r.level(), r.target(), &r.args().to_string());
            writeln!(buf, "{line}")
        });
    }
    b.init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vm_is_found_where_hqdmux_names_it() {
        assert_eq!(vm_of("api: vm 'web-1': stop requested"), Some("web-1"));
        assert_eq!(
            vm_of("vgpu 'training': serving vfio-user on t.sock"),
            Some("training")
        );
        assert_eq!(vm_of("vm db: doorbell 3 at 0x1000: EBUSY"), Some("db"));
        assert_eq!(vm_of("gpu: arbiter started for vm 'a b'"), Some("a b"));
        assert_eq!(vm_of("serve: stopping"), None);
        assert_eq!(vm_of("vm with spaces: no"), None);
        assert_eq!(vm_of("vm 'unterminated"), None);
    }

    #[test]
    fn a_json_line_is_one_object_with_escaped_fields() {
        let l = json_line(
            "2026-11-27T03:00:00.000001Z",
            log::Level::Warn,
            "vmm::api",
            "api: vm 'x\"y': bad \n line",
        );
        assert!(!l.contains('\n'), "{l}");
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["ts"], "2026-11-27T03:00:00.000001Z");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "vmm::api");
        assert_eq!(v["msg"], "api: vm 'x\"y': bad \n line");
        assert_eq!(v["vm"], "x\"y");
        let v: serde_json::Value =
            serde_json::from_str(&json_line("t", log::Level::Info, "m", "serve: stopping"))
                .unwrap();
        assert!(v.get("vm").is_none());
        assert_eq!(v.as_object().unwrap().len(), 4);
    }
}
