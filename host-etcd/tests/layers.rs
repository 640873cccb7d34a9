//! The crate's layers, checked: each module may import only from the layers below it (the
//! order of the table in `src/lib.rs`), so there is no import circle and nothing below the
//! server depends on it. A module's layer is its top-level name (`session::driver` is in
//! `session`).
//!
//! This reads `use crate::…` and `crate::…::` paths from the sources; it is what `cargo
//! modules dependencies --acyclic` would say, without installing it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. Modules on one line may use each other only where noted below.
const LAYERS: &[&[&str]] = &[
    &["clock", "keys", "config", "metrics", "convert", "queue"],
    &["upstream"],
    &["cache"],
    &["reflector", "consistency"],
    &["session"],
    &["library"],
    &["server"],
    &["etcd_launcher"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`src/session/driver.rs` → `session`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// Every `crate::X` named in the file (outside comments).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String =
                after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.insert(name);
            }
            rest = after;
        }
    }
    out
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(m) = module_of(&src, f) else { continue };
        assert!(
            layer_of(&m).is_some(),
            "module {m} ({}) is in no layer: add it to LAYERS and to lib.rs's table",
            f.display()
        );
        let text = std::fs::read_to_string(f).expect("read");
        for used in crate_paths(&text) {
            if used != m && layer_of(&used).is_some() {
                uses.entry(m.clone()).or_default().insert(used);
            }
        }
    }
    let mut wrong = Vec::new();
    for (m, used) in &uses {
        let lm = layer_of(m).expect("layer");
        for u in used {
            let lu = layer_of(u).expect("layer");
            if lu >= lm {
                wrong.push(format!("{m} (layer {lm}) uses {u} (layer {lu})"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering:\n{}", wrong.join("\n"));
    // The check sees something (a broken parser would pass vacuously).
    assert!(uses.get("session").is_some_and(|u| u.contains("cache")), "{uses:?}");
    assert!(uses.get("server").is_some_and(|u| u.contains("library")), "{uses:?}");
}

#[test]
fn the_parser_finds_crate_paths() {
    let paths = crate_paths("use crate::cache::CacheHandle;\n// crate::server is a comment\nlet x = crate::keys::etcd_range(r);");
    assert_eq!(paths, ["cache", "keys"].iter().map(|s| s.to_string()).collect());
}
