//! Client JSON schemas (`response_format: json_schema`) made safe for the embedded model's
//! grammar.
//!
//! The embedded model keeps to a schema through a llama.cpp grammar, and the grammar's cost
//! grows with how many ways a piece of text can still be read: every `anyOf`, `oneOf` or list
//! of types nested inside another multiplies the parse stacks the model thread tracks at each
//! token. A schema of a few hundred bytes can nest forty choices of two and hold the shared
//! model for hours. So a client schema is first brought to a plain tree and measured:
//!
//! - local references (`#/$defs/...`, `#/definitions/...`, `#`) are written out in place; a
//!   schema that refers to itself (a recursive type) or to another document is refused;
//! - the tree may be at most [`MAX_DEPTH`] levels deep and [`MAX_EXPANDED_BYTES`] long;
//! - along any path from the root, the choices multiplied together are at most
//!   [`MAX_READINGS`];
//! - a `pattern` is at most [`MAX_PATTERN`] characters, and a group that repeats may not
//!   hold a repetition itself (`(a+)*`, which the grammar engine can loop on).
//!
//! What passes goes to the grammar converter; whatever the converter still cannot express is
//! refused there ([`super::LlmError::Schema`]).

use serde_json::{Map, Value};

/// Deepest nesting of objects and arrays in a schema, written-out references included.
pub const MAX_DEPTH: usize = 32;
/// Longest schema once its references are written out, in bytes of compact JSON.
pub const MAX_EXPANDED_BYTES: usize = 64 * 1024;
/// Most readings the choices along one path may multiply to.
pub const MAX_READINGS: u64 = 64;
/// Longest `pattern`, in characters.
pub const MAX_PATTERN: usize = 256;

/// Why a schema is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn refused(message: impl Into<String>) -> Refused {
    Refused(message.into())
}

/// `schema` with its references written out, once it is within every bound above.
pub fn prepare(schema: &Value) -> Result<Value, Refused> {
    if !schema.is_object() {
        return Err(refused("the schema must be a JSON object"));
    }
    let mut budget = MAX_EXPANDED_BYTES;
    let expanded = expand(schema, schema, &mut Vec::new(), 0, &mut budget)?;
    let readings = readings(&expanded);
    if readings > MAX_READINGS {
        return Err(refused(format!(
            "the schema's nested anyOf/oneOf/type choices multiply to more than {MAX_READINGS} readings"
        )));
    }
    Ok(expanded)
}

/// A copy of `node` with every `$ref` replaced by what it points to. `open` holds the
/// references being written out (a reference met again inside itself is a recursive type),
/// `budget` the bytes the copy may still take.
fn expand(
    root: &Value,
    node: &Value,
    open: &mut Vec<String>,
    depth: usize,
    budget: &mut usize,
) -> Result<Value, Refused> {
    if depth > MAX_DEPTH {
        return Err(refused(format!(
            "the schema nests deeper than {MAX_DEPTH} levels"
        )));
    }
    let spend = |budget: &mut usize, bytes: usize| {
        *budget = budget.checked_sub(bytes).ok_or_else(|| {
            refused(format!(
                "the schema is longer than {MAX_EXPANDED_BYTES} bytes once its references are written out"
            ))
        })?;
        Ok::<(), Refused>(())
    };
    match node {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref") {
                let reference = reference
                    .as_str()
                    .ok_or_else(|| refused("$ref must be a string"))?;
                if open.iter().any(|r| r == reference) {
                    return Err(refused(format!(
                        "the schema refers to itself through {reference}: recursive schemas are not supported"
                    )));
                }
                let target = resolve(root, reference)?;
                open.push(reference.to_owned());
                let mut out = expand(root, target, open, depth + 1, budget)?;
                open.pop();
                // Keywords beside the reference (a description, say) are kept.
                if let Value::Object(out_map) = &mut out {
                    for (key, value) in map {
                        if key != "$ref" && !out_map.contains_key(key) {
                            let value = expand(root, value, open, depth + 1, budget)?;
                            out_map.insert(key.clone(), value);
                        }
                    }
                }
                return Ok(out);
            }
            if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
                check_pattern(pattern)?;
            }
            let mut out = Map::new();
            for (key, value) in map {
                // Definitions are written out where they are used.
                if key == "$defs" || key == "definitions" {
                    continue;
                }
                spend(budget, key.len() + 4)?;
                out.insert(key.clone(), expand(root, value, open, depth + 1, budget)?);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                spend(budget, 1)?;
                out.push(expand(root, item, open, depth + 1, budget)?);
            }
            Ok(Value::Array(out))
        }
        scalar => {
            spend(budget, scalar.to_string().len())?;
            Ok(scalar.clone())
        }
    }
}

/// What a local reference points to: `#`, or a JSON pointer after `#`.
fn resolve<'a>(root: &'a Value, reference: &str) -> Result<&'a Value, Refused> {
    let pointer = reference.strip_prefix('#').ok_or_else(|| {
        refused(format!(
            "$ref {reference:?} points outside the schema: only local references (#/$defs/...) are supported"
        ))
    })?;
    root.pointer(pointer).ok_or_else(|| {
        refused(format!(
            "$ref {reference:?} points to nothing in the schema"
        ))
    })
}

/// The most readings along one path from `node` down: its own choices (`anyOf`, `oneOf`, a
/// list of types) times the most of any part below it. Saturates rather than overflows.
fn readings(node: &Value) -> u64 {
    match node {
        Value::Object(map) => {
            let own = ["anyOf", "oneOf", "type"]
                .iter()
                .filter_map(|k| map.get(*k).and_then(Value::as_array))
                .map(|a| a.len().max(1) as u64)
                .fold(1u64, u64::saturating_mul);
            let below = map.values().map(readings).max().unwrap_or(1);
            own.saturating_mul(below)
        }
        Value::Array(items) => items.iter().map(readings).max().unwrap_or(1),
        _ => 1,
    }
}

/// Refuses a pattern that is too long, or in which a repeated group holds a repetition.
fn check_pattern(pattern: &str) -> Result<(), Refused> {
    if pattern.chars().count() > MAX_PATTERN {
        return Err(refused(format!(
            "a pattern is longer than {MAX_PATTERN} characters"
        )));
    }
    // For each open group, whether a repetition has been seen inside it.
    let mut groups: Vec<bool> = Vec::new();
    // Whether the element just closed is a group holding a repetition.
    let mut closed_repeating = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        let mut next_closed = false;
        match c {
            '\\' => {
                chars.next();
            }
            '[' => {
                // A class: up to its closing bracket, escapes skipped.
                if chars.peek() == Some(&']') {
                    chars.next();
                }
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        ']' => break,
                        _ => {}
                    }
                }
            }
            '(' => groups.push(false),
            ')' => {
                next_closed = groups.pop().unwrap_or(false);
            }
            '*' | '+' | '?' | '{' => {
                if closed_repeating && c != '?' {
                    return Err(refused(
                        "a pattern repeats a group that itself repeats (such as (a+)*)",
                    ));
                }
                if c == '{' {
                    for d in chars.by_ref() {
                        if d == '}' {
                            break;
                        }
                    }
                }
                if let Some(inner) = groups.last_mut() {
                    *inner = true;
                }
            }
            _ => {}
        }
        closed_repeating = next_closed;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_references_are_written_out_in_place() {
        // The shape a Pydantic model with a nested model gives.
        let schema = json!({
            "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}},
            "type": "object",
            "properties": {
                "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                "first": {"$ref": "#/$defs/Item", "description": "the first"}
            }
        });
        let out = prepare(&schema).unwrap();
        assert!(out.get("$defs").is_none());
        assert_eq!(
            out["properties"]["items"]["items"]["properties"]["sku"]["type"],
            "string"
        );
        assert_eq!(out["properties"]["first"]["description"], "the first");
        assert_eq!(out["properties"]["first"]["required"], json!(["sku"]));
        // A schema without references comes back as it was.
        let plain = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(prepare(&plain).unwrap(), plain);
    }

    #[test]
    fn recursive_remote_and_dangling_references_are_refused() {
        let recursive = json!({
            "$defs": {"Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}}},
            "$ref": "#/$defs/Node"
        });
        assert!(prepare(&recursive).unwrap_err().0.contains("recursive"));
        let itself = json!({"type": "object", "properties": {"again": {"$ref": "#"}}});
        assert!(prepare(&itself).unwrap_err().0.contains("recursive"));
        let remote = json!({"$ref": "https://example.com/schema.json"});
        assert!(prepare(&remote).unwrap_err().0.contains("local"));
        let dangling = json!({"$ref": "#/$defs/Missing"});
        assert!(prepare(&dangling).unwrap_err().0.contains("nothing"));
        assert!(prepare(&json!({"$ref": 5})).is_err());
        assert!(prepare(&json!(["not", "an", "object"])).is_err());
    }

    #[test]
    fn nested_choices_are_bounded_by_their_product() {
        // Six levels of a choice of two: 64 readings, the most allowed.
        let mut schema = json!({"type": "string"});
        for _ in 0..6 {
            schema = json!({"anyOf": [schema.clone(), {"type": "integer"}]});
        }
        assert!(prepare(&schema).is_ok());
        let seven = json!({"anyOf": [schema, {"type": "null"}]});
        assert!(prepare(&seven).unwrap_err().0.contains("readings"));
        // A list of types is a choice too.
        let typed = json!({"type": ["string", "null"], "anyOf": [{}, {}, {}, {}, {}, {}, {}, {}],
            "items": {"oneOf": [{}, {}, {}, {}, {}]}});
        assert!(prepare(&typed).is_err());
        // Choices side by side do not multiply.
        let wide = json!({"type": "object", "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "c": {"oneOf": (0..40).map(|i| json!({"const": i})).collect::<Vec<_>>()}
        }});
        assert!(prepare(&wide).is_ok());
        // The references' fan-out counts once written out: few bytes, many readings.
        let mut defs = serde_json::Map::new();
        for i in 0..10 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d10".into(), json!({"type": "string"}));
        let fan = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(prepare(&fan).is_err());
    }

    #[test]
    fn depth_and_expanded_size_are_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "array", "items": deep});
        }
        assert!(prepare(&deep).unwrap_err().0.contains("deeper"));
        // Each level used twice: 2^9 copies of the leaf, far past the byte bound.
        let mut defs = serde_json::Map::new();
        for i in 0..9 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert(
            "d9".into(),
            json!({"type": "string", "description": "x".repeat(200)}),
        );
        let doubled = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(prepare(&doubled).unwrap_err().0.contains("bytes"));
    }

    #[test]
    fn patterns_are_bounded_and_may_not_nest_repetition() {
        let with = |p: &str| json!({"type": "string", "pattern": p});
        for ok in [
            "^[A-Z]{2}-[0-9]{4}$",
            "^(ab)+$",
            "^(a|b)*c?$",
            "^\\(a+\\)*$",
            "^[(+)]*$",
            "^(a)?$",
        ] {
            assert!(prepare(&with(ok)).is_ok(), "{ok}");
        }
        for bad in ["(a+)*", "^(a*)+$", "((ab)*c)+", "(x{2,3}){4}", "(a?)*"] {
            assert!(prepare(&with(bad)).is_err(), "{bad}");
        }
        assert!(prepare(&with(&"a".repeat(MAX_PATTERN + 1))).is_err());
    }
}
