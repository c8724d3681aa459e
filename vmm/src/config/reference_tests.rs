//! docs/config.md against the parser: every field the fleet file accepts
//! has a row there and every row names an accepted field; every default
//! written as a TOML value, set explicitly, gives the configuration that
//! leaving the field out gives; every range written `A..=B` or `>= A` holds
//! at its ends and not just outside them. The field names come from the
//! serde structs themselves (a deserializer that records the field list
//! `#[derive(Deserialize)]` hands to `deserialize_struct`), so a field added
//! to a struct without a row here fails the test.

use super::*;
use serde::de::{self, DeserializeOwned, Visitor};

const DOC: &str = include_str!("../../../docs/config.md");

/// Records the field names of the struct deserialized from it, then fails.
struct Probe<'a>(&'a mut &'static [&'static str]);

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("probed"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// The field names serde accepts for `T`.
fn fields<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut f: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut f));
    assert!(
        !f.is_empty(),
        "{} has no fields",
        std::any::type_name::<T>()
    );
    f
}

/// (table, its fields) for every table of the fleet file.
fn tables() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("run", fields::<RunConfig>()),
        ("gpu", fields::<GpuSection>()),
        ("gpu.cwsr", fields::<gpu::topology::CwsrModel>()),
        ("gpu.sim", fields::<gpusim::SimParams>()),
        ("gpu.guard", fields::<mdev::guard::GuardConfig>()),
        ("scheduler", fields::<scheduler::SchedConfig>()),
        ("vm", &VM_FIELDS),
        ("vm.guard", fields::<mdev::guard::GuardOverride>()),
    ]
}

/// Every key the parser accepts, as `table.field` (top-level keys bare).
fn accepted() -> Vec<String> {
    let mut keys: Vec<String> = fields::<FleetFile>()
        .iter()
        .map(|f| f.to_string())
        .collect();
    for (t, fs) in tables() {
        keys.extend(fs.iter().map(|f| format!("{t}.{f}")));
    }
    keys
}

/// The rows of docs/config.md: key and the other cells.
fn rows() -> Vec<(String, Vec<String>)> {
    DOC.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| {
            let (key, rest) = l.split_once('`').expect("closing backtick");
            let cells = rest
                .split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            (key.to_string(), cells)
        })
        .collect()
}

const BASE_VM: &str = "[[vm]]\nname = \"a\"\nimage = \"builtin:hello\"\n";

/// A fleet file with `key` set to `value` (a TOML value).
fn with(key: &str, value: &str) -> String {
    let (table, field) = key.rsplit_once('.').expect("table.field");
    match table {
        "vm" => format!("{BASE_VM}{field} = {value}\n"),
        "vm.guard" => format!("{BASE_VM}guard = {{ {field} = {value} }}\n"),
        t => format!("[{t}]\n{field} = {value}\n{BASE_VM}"),
    }
}

fn parse(text: &str) -> Result<FleetConfig, ConfigError> {
    FleetConfig::parse(text, Path::new("/cfg/fleet.toml"))
}

/// The TOML literal a cell starts with, if it starts with a backticked one.
fn literal(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?.split_once('`').map(|(l, _)| l)
}

#[test]
fn every_accepted_field_has_a_row_and_every_row_is_accepted() {
    let accepted = accepted();
    let documented: Vec<String> = rows().into_iter().map(|r| r.0).collect();
    // Keys that are tables with their own section may also have a row.
    let sub_tables: Vec<&str> = tables().iter().map(|t| t.0).collect();
    for k in &accepted {
        assert!(
            documented.contains(k) || sub_tables.contains(&k.as_str()),
            "docs/config.md has no row for `{k}`"
        );
    }
    for k in &documented {
        assert!(
            accepted.contains(k),
            "docs/config.md documents `{k}`, which the parser does not accept"
        );
    }
    assert!(documented.len() >= 50, "{documented:?}");
}

#[test]
fn documented_defaults_are_the_defaults() {
    let base = format!("{:?}", parse(BASE_VM).unwrap());
    let mut checked = 0;
    for (key, cells) in rows() {
        if cells.len() != 4 {
            continue; // the top-level table: key and meaning
        }
        let default = &cells[1];
        let Some(value) = literal(default) else {
            assert!(
                ["required", "none"].iter().any(|w| default.starts_with(w)),
                "`{key}`: default {default:?} is neither a TOML value nor required/none"
            );
            continue;
        };
        let text = with(&key, value);
        let cfg = parse(&text).unwrap_or_else(|e| panic!("`{key}` = {value}: {e}"));
        assert_eq!(
            format!("{cfg:?}"),
            base,
            "`{key}` = {value} (documented default) is not the default"
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} defaults checked");
}

#[test]
fn documented_ranges_hold_at_their_ends_and_not_beyond() {
    let mut checked = 0;
    for (key, cells) in rows() {
        if cells.len() != 4 {
            continue;
        }
        let Some(range) = literal(&cells[2]) else {
            continue;
        };
        let (lo, hi): (i64, Option<i64>) = if let Some(lo) = range.strip_prefix(">= ") {
            (lo.parse().unwrap(), None)
        } else if let Some((lo, hi)) = range.split_once("..=") {
            (lo.parse().unwrap(), Some(hi.parse().unwrap()))
        } else {
            continue; // a list of strings or booleans
        };
        let ok = |v: i64| parse(&with(&key, &v.to_string()));
        ok(lo).unwrap_or_else(|e| panic!("`{key}` = {lo}, the documented minimum: {e}"));
        let top = hi.unwrap_or(i64::MAX);
        ok(top).unwrap_or_else(|e| panic!("`{key}` = {top}, the documented maximum: {e}"));
        if let Some(below) = lo.checked_sub(1) {
            assert!(
                ok(below).is_err(),
                "`{key}` = {below} is below {range} but accepted"
            );
        }
        if let Some(above) = hi.and_then(|h| h.checked_add(1)) {
            assert!(
                ok(above).is_err(),
                "`{key}` = {above} is above {range} but accepted"
            );
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} ranges checked");
}
