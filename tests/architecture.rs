//! The house rules that keep the code easy to live in, checked on the sources:
//! - no import circles between modules (file by file, and between the top-level modules of
//!   each crate), read from `crate::` and `super::` paths;
//! - WebSocket close codes are chosen in `src/http/errors.rs` only;
//! - one lock policy: parking_lot's locks, which are never poisoned, and no std lock anywhere
//!   (tests included), so no code has to decide what a poisoned lock means.
//!
//! Test modules (`#[cfg(test)] mod tests`) are left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, with its module path (`http::errors`; the crate root is "").
fn modules(dir: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(dir).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            (parts.join("::"), file)
        })
        .collect()
}

/// The source without its test module.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// Parses a use tree starting at `s` (after `crate::` or `super::`): every full path it names.
fn use_paths(s: &str) -> Vec<String> {
    fn ident(s: &[u8], mut i: usize) -> (String, usize) {
        let start = i;
        while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
            i += 1;
        }
        (String::from_utf8_lossy(&s[start..i]).into_owned(), i)
    }
    fn skip_ws(s: &[u8], mut i: usize) -> usize {
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }
    // Returns the paths of the tree at `i` and where it ends.
    fn tree(s: &[u8], i: usize, prefix: &str, out: &mut Vec<String>) -> usize {
        let mut i = skip_ws(s, i);
        if i < s.len() && s[i] == b'{' {
            i += 1;
            loop {
                i = skip_ws(s, i);
                if i >= s.len() {
                    return i;
                }
                if s[i] == b'}' {
                    return i + 1;
                }
                if s[i] == b',' {
                    i += 1;
                    continue;
                }
                let before = i;
                i = tree(s, i, prefix, out);
                if i == before {
                    // Something we do not read (`*`, `self`): skip a byte.
                    i += 1;
                }
            }
        }
        let (name, next) = ident(s, i);
        if name.is_empty() {
            return i;
        }
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}::{name}")
        };
        out.push(path.clone());
        if s.get(next..next + 2) == Some(b"::".as_slice()) {
            return tree(s, next + 2, &path, out);
        }
        next
    }
    let mut out = Vec::new();
    tree(s.as_bytes(), 0, "", &mut out);
    out
}

/// Module -> modules it names, resolved to the longest known module prefix. Edges to one's own
/// ancestors (`super::Item` of a parent's `mod.rs`) are left out: a child may use its parent.
fn graph(modules: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |path: &str| -> Option<String> {
        let segments: Vec<&str> = path.split("::").collect();
        (1..=segments.len())
            .rev()
            .map(|n| segments[..n].join("::"))
            .find(|m| modules.contains_key(m))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in modules {
        let text = code(file);
        let parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
        let parent = parent[..parent.len().saturating_sub(1)].join("::");
        let mut targets = Vec::new();
        for (keyword, base) in [("crate::", String::new()), ("super::", parent)] {
            let mut from = 0;
            while let Some(at) = text[from..].find(keyword) {
                let start = from + at;
                from = start + keyword.len();
                let boundary = text[..start]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
                if !boundary {
                    continue;
                }
                for path in use_paths(&text[from..]) {
                    let full = if base.is_empty() {
                        path
                    } else {
                        format!("{base}::{path}")
                    };
                    targets.extend(resolve(&full));
                }
            }
        }
        for target in targets {
            let ancestor = target.is_empty() || module.starts_with(&format!("{target}::"));
            if target != *module && !ancestor {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// The strongly connected components with more than one module (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a.as_str()).chain(bs.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The same graph between top-level modules.
fn top_level(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            let (ta, tb) = (top(a), top(b));
            if ta != tb && !ta.is_empty() && !tb.is_empty() {
                out.entry(ta).or_default().insert(tb);
            }
        }
    }
    out
}

#[test]
fn the_use_tree_reader_finds_every_path() {
    assert_eq!(
        use_paths("a::{b, c::{d, e}, f}, g;"),
        ["a", "a::b", "a::c", "a::c::d", "a::c::e", "a::f"]
    );
    assert_eq!(use_paths("x::y(1)"), ["x", "x::y"]);
}

#[test]
fn the_circle_finder_finds_circles() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        edges.entry(a.into()).or_default().insert(b.into());
    }
    assert_eq!(circles(&edges), [vec!["a", "b", "c"]]);
}

#[test]
fn no_import_circles() {
    for crate_dir in ["src", "actors/src"] {
        let modules = modules(&root().join(crate_dir));
        assert!(modules.len() > 10, "{crate_dir} has its modules");
        let edges = graph(&modules);
        assert!(
            edges.values().map(BTreeSet::len).sum::<usize>() > 10,
            "{crate_dir}: the graph was read"
        );
        assert_eq!(circles(&edges), Vec::<Vec<String>>::new(), "{crate_dir}");
        assert_eq!(
            circles(&top_level(&edges)),
            Vec::<Vec<String>>::new(),
            "{crate_dir}, top-level modules"
        );
    }
}

#[test]
fn close_codes_are_chosen_in_one_place() {
    let own = root().join("src/http/errors.rs");
    for crate_dir in ["src", "actors/src"] {
        for file in modules(&root().join(crate_dir)).values() {
            if *file == own {
                continue;
            }
            let text = code(file);
            for number in ["1001", "1011", "4401", "4402", "4404", "close_with(1000"] {
                assert!(
                    !text.contains(number),
                    "{} names the close code {number}; close codes come from http::errors::close_frame",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn every_lock_is_a_parking_lot_lock() {
    let dirs = [
        "src",
        "actors/src",
        "tests",
        "actors/tests",
        "benches",
        "actors/benches",
    ];
    for dir in dirs {
        let dir = root().join(dir);
        if !dir.is_dir() {
            continue;
        }
        for file in modules(&dir).values() {
            if file.ends_with("tests/architecture.rs") {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            for std_lock in [
                "std::sync::Mutex",
                "std::sync::RwLock",
                "std::sync::Condvar",
                "PoisonError",
                "sync::{Arc, Mutex",
                "sync::{Mutex",
                "sync::{Arc, RwLock",
                "sync::{RwLock",
                "sync::{Arc, Condvar",
            ] {
                assert!(
                    !text.contains(std_lock),
                    "{} uses {std_lock}: locks are parking_lot's (no poisoning)",
                    file.display()
                );
            }
        }
    }
}

/// Storage never holds an async runtime's worker: the store's traits are async, PostgreSQL is
/// reached through tokio-postgres on a pool, never the blocking `postgres` client, and nothing
/// parks a worker with `block_in_place`.
#[test]
fn storage_never_blocks_a_runtime_worker() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        !manifest
            .lines()
            .any(|l| l.trim_start().starts_with("postgres =")),
        "Cargo.toml depends on the blocking postgres client"
    );
    for dir in ["src", "actors/src", "tests", "benches"] {
        let dir = root().join(dir);
        if !dir.is_dir() {
            continue;
        }
        for file in modules(&dir).values() {
            if file.ends_with("tests/architecture.rs") {
                continue;
            }
            let text = code(file);
            let service = !file.starts_with(root().join("tests"));
            let mut blocking = vec!["postgres::Client", "use postgres::", "postgres::NoTls"];
            if service {
                // A test may park its own worker to wait on a child process.
                blocking.push("block_in_place");
            }
            for blocking in blocking {
                let found = text.match_indices(blocking).any(|(i, _)| {
                    !text[..i].ends_with("tokio_") && !text[..i].ends_with("deadpool_")
                });
                assert!(!found, "{} uses {blocking}", file.display());
            }
        }
    }
    let traits = [
        ("src/store/mod.rs", "pub trait Store"),
        ("src/store/shared.rs", "pub trait SharedState"),
        ("actors/src/usage.rs", "pub trait UsageSink"),
        ("actors/src/usage.rs", "pub trait QuotaGate"),
    ];
    for (file, declaration) in traits {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let at = text
            .find(declaration)
            .unwrap_or_else(|| panic!("{declaration} in {file}"));
        let before = text[..at].trim_end();
        assert!(
            before.ends_with("#[async_trait::async_trait]"),
            "{declaration} ({file}) is not async"
        );
    }
}

/// Test doubles sit behind the actors crate's `test-util` feature, which the service never turns
/// on; whatever a test build unifies, none of their code reaches the binary.
#[test]
fn no_test_double_is_linked_into_the_binary() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.starts_with("callstream-actors = "))
        .unwrap();
    assert!(!line.contains("test-util"), "{line}");
    let symbols = std::process::Command::new("nm")
        .args(["-C", env!("CARGO_BIN_EXE_callstream")])
        .output()
        .unwrap();
    assert!(symbols.status.success(), "nm failed");
    let symbols = String::from_utf8_lossy(&symbols.stdout);
    // The binary's own symbols are there to look at (it is not stripped).
    assert!(symbols.contains("callstream::"), "no symbols to check");
    for double in ["asr::scripted", "ScriptedEngine"] {
        assert!(
            !symbols.contains(double),
            "the binary links test code: {double}"
        );
    }
}

/// Longest a source file may be, its test module aside: about what one concept takes.
const MAX_FILE_LINES: usize = 800;

/// Whether `file` is a module its parent declares for tests only (`#[cfg(test)] mod name;`).
fn test_only(file: &Path) -> bool {
    let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
    let dir = file.parent().unwrap();
    let parents = [
        dir.join("mod.rs"),
        dir.join("lib.rs"),
        dir.join("main.rs"),
        dir.with_extension("rs"),
    ];
    let declared = format!("#[cfg(test)]\nmod {stem};");
    stem != "mod"
        && parents.iter().any(|parent| {
            std::fs::read_to_string(parent).is_ok_and(|text| text.contains(&declared))
        })
}

#[test]
fn no_source_file_is_longer_than_one_concept_takes() {
    for crate_dir in ["src", "actors/src"] {
        for file in modules(&root().join(crate_dir)).values() {
            if test_only(file) {
                continue;
            }
            let relative = file
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let lines = code(file).lines().count();
            assert!(
                lines <= MAX_FILE_LINES,
                "{relative} has {lines} lines besides its tests (at most {MAX_FILE_LINES}): \
                 split it by concept"
            );
        }
    }
}

/// Whether `code` indexes a JSON value by key (`record["status"]`, `x)["a"]`, `y]["b"]`): a
/// `["` right after a name, a call or another index. An array literal (`= ["a"]`, `&["b"]`)
/// follows something else.
fn indexes_by_key(code: &str) -> Option<&str> {
    code.lines().find(|line| {
        line.match_indices("[\"").any(|(at, _)| {
            line[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | ')' | ']'))
        })
    })
}

#[test]
fn the_key_index_finder_finds_indexing_and_not_arrays() {
    assert!(indexes_by_key(r#"let s = record["status"];"#).is_some());
    assert!(indexes_by_key(r#"x.get(0)["a"]"#).is_some());
    assert!(indexes_by_key(r#"v["a"]["b"]"#).is_some());
    assert!(indexes_by_key(r#"let a = ["a", "b"]; f(&["c"]); [["d"]]"#).is_none());
}

/// The analyses read and change records through their types (`profiles::record`), never by
/// a key into untyped JSON: a misspelt key there is a silent no-op, a misspelt field a
/// compile error. Schemas are JSON documents and are edited as such, by pointer.
#[test]
fn analysis_code_reads_records_by_type_not_by_key() {
    for file in modules(&root().join("src/llm/profiles")).values() {
        if test_only(file) {
            continue;
        }
        if let Some(line) = indexes_by_key(&code(file)) {
            panic!("{} indexes JSON by key: {}", file.display(), line.trim());
        }
    }
}
