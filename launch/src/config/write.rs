//! The hostfile's text: Python's `json.dumps(hostfile, indent=4)`, byte for byte.
//!
//! Keys in MLX's order (`backend`, `envs`, `hosts`; per host `ssh`, `ips`, `rdma`), four
//! spaces per level, `,` at line ends, `": "` after keys, `[]` for an empty list and strings
//! escaped as Python escapes them (every character outside printable ASCII as `\uXXXX`,
//! through [`crate::plan::py_json`]). The file written with `--output-hostfile` has no
//! trailing newline (`json.dump`); printed, it is followed by one (`print`).

use serde_json::Value;

use super::plan::{Devices, Hostfile};

/// A JSON value in the shape the hostfile needs, in key order.
enum Json<'a> {
    Null,
    Str(&'a str),
    List(Vec<Json<'a>>),
    Object(Vec<(&'static str, Json<'a>)>),
}

fn strings(v: &[String]) -> Json<'_> {
    Json::List(v.iter().map(|s| Json::Str(s)).collect())
}

fn devices(d: &Devices) -> Json<'_> {
    match d {
        Devices::None => Json::Null,
        Devices::One(s) => Json::Str(s),
        Devices::Many(v) => strings(v),
    }
}

/// `hostfile` as `json.dumps(..., indent=4)` writes it (no trailing newline).
pub(crate) fn hostfile_json(hostfile: &Hostfile) -> String {
    let hosts = hostfile
        .hosts
        .iter()
        .map(|h| {
            Json::Object(vec![
                ("ssh", Json::Str(&h.ssh)),
                ("ips", strings(&h.ips)),
                ("rdma", Json::List(h.rdma.iter().map(devices).collect())),
            ])
        })
        .collect();
    let root = Json::Object(vec![
        ("backend", Json::Str(&hostfile.backend)),
        ("envs", strings(&hostfile.envs)),
        ("hosts", Json::List(hosts)),
    ]);
    let mut out = String::new();
    write(&root, 0, &mut out);
    out
}

fn write(v: &Json<'_>, level: usize, out: &mut String) {
    let indent = |l: usize| "    ".repeat(l);
    match v {
        Json::Null => out.push_str("null"),
        Json::Str(s) => out.push_str(&crate::plan::py_json(&Value::String((*s).to_owned()))),
        Json::List(items) if items.is_empty() => out.push_str("[]"),
        Json::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&indent(level + 1));
                write(item, level + 1, out);
            }
            out.push('\n');
            out.push_str(&indent(level));
            out.push(']');
        }
        Json::Object(fields) if fields.is_empty() => out.push_str("{}"),
        Json::Object(fields) => {
            out.push('{');
            for (i, (key, value)) in fields.iter().enumerate() {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&indent(level + 1));
                out.push_str(&format!("\"{key}\": "));
                write(value, level + 1, out);
            }
            out.push('\n');
            out.push_str(&indent(level));
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::plan::HostEntry;

    #[test]
    fn the_hostfile_is_pythons_indented_json_in_mlxs_key_order() {
        let h = Hostfile {
            backend: "jaccl".into(),
            envs: vec![],
            hosts: vec![HostEntry {
                ssh: "mac-é".into(),
                ips: vec!["10.0.0.1".into()],
                rdma: vec![
                    Devices::None,
                    Devices::One("rdma_en2".into()),
                    Devices::Many(vec!["rdma_en3".into(), "rdma_en4".into()]),
                ],
            }],
        };
        let want = "{\n    \"backend\": \"jaccl\",\n    \"envs\": [],\n    \"hosts\": [\n        {\n            \"ssh\": \"mac-\\u00e9\",\n            \"ips\": [\n                \"10.0.0.1\"\n            ],\n            \"rdma\": [\n                null,\n                \"rdma_en2\",\n                [\n                    \"rdma_en3\",\n                    \"rdma_en4\"\n                ]\n            ]\n        }\n    ]\n}";
        assert_eq!(hostfile_json(&h), want);
    }
}
