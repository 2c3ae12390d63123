//! What a schema forces next, in the middle of an answer: after an enum's value is told apart
//! from the others, the rest of it; after a value, the next required property's name and the
//! start of its value, or the end of an object that can hold nothing more, or of an array that
//! is full. The model gets no choice there under its grammar, so the text is added with the
//! token it follows and evaluated in the same step, not written a token at a time. It is
//! written compactly, as [`lead_text`] writes an answer's start, and stops wherever the
//! schema leaves a choice (a free string, a number, an optional property, another element).

use serde_json::Value;

use super::lead_within;

/// Most characters forced at once: past it, the rest is forced at the next token.
const MOST: usize = 128;

/// What the reader of a value expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A property's name (after `{` or a comma in an object).
    Key,
    /// The colon after a name.
    Colon,
    /// A value (after a colon, `[`, or a comma in an array).
    Value,
    /// A comma or the container's end (after a value).
    Next,
}

/// An open container of the answer so far, with the schema it is held to.
struct Frame<'s> {
    schema: &'s Value,
    /// An object's properties written or being written, by name; `None` for an array.
    keys: Option<Vec<String>>,
    /// An array's elements written.
    count: usize,
    want: Want,
}

/// Where the answer so far ends.
enum End<'s> {
    /// Inside a string: its text so far, whether it is a property's name, its schema.
    Str(String, bool, &'s Value),
    /// Inside a number or a literal (`true`, `null`...).
    Scalar,
    /// Between tokens of the JSON text, in the innermost container left open; `done` once
    /// the whole answer is closed.
    Between { done: bool },
}

/// The text `schema` forces after `written`, a prefix of an answer its grammar accepts, up to
/// [`MOST`] characters; empty where the model has a choice.
pub(super) fn forced_text(schema: &Value, written: &str) -> String {
    let mut out = String::new();
    let mut text = written.to_owned();
    while out.len() < MOST {
        let next = forced_once(schema, &text);
        if next.is_empty() {
            break;
        }
        text.push_str(&next);
        out.push_str(&next);
    }
    out
}

/// One stretch of forced text: up to where the text reaches a new state of the reader.
fn forced_once(schema: &Value, written: &str) -> String {
    let mut stack: Vec<Frame> = Vec::new();
    let end = read(schema, written, &mut stack);
    match end {
        End::Str(text, false, value) => enum_rest(value, &text),
        End::Str(..) | End::Scalar | End::Between { done: true } => String::new(),
        End::Between { done: false } => match stack.last() {
            None => String::new(),
            Some(top) => match (&top.keys, top.want) {
                (Some(keys), want) => object_next(top.schema, keys, want),
                (None, Want::Value) => {
                    let least = top.schema.get("minItems").and_then(Value::as_u64);
                    // After `[`, a value only where the array cannot be empty; after a comma,
                    // always.
                    let comma = written.trim_end().ends_with(',');
                    if comma || least.unwrap_or(0) > top.count as u64 {
                        lead_within(top.schema.get("items").unwrap_or(&Value::Null), 16)
                    } else {
                        String::new()
                    }
                }
                (None, Want::Next) => {
                    let most = top.schema.get("maxItems").and_then(Value::as_u64);
                    if most.is_some_and(|m| top.count as u64 >= m) {
                        "]".into()
                    } else {
                        String::new()
                    }
                }
                (None, _) => String::new(),
            },
        },
    }
}

/// The rest of the one value of `schema`'s string enum that starts with `text`, closed, when
/// exactly one does.
fn enum_rest(schema: &Value, text: &str) -> String {
    let Some(values) = schema.get("enum").and_then(Value::as_array) else {
        return String::new();
    };
    let mut fits = values
        .iter()
        .filter_map(Value::as_str)
        .filter(|v| v.starts_with(text));
    match (fits.next(), fits.next()) {
        // Plain labels only: one that needs escaping is left to the model.
        (Some(only), None) if !only.contains(['"', '\\']) && only.is_ascii() => {
            format!("{}\"", &only[text.len()..])
        }
        _ => String::new(),
    }
}

/// What an object held to `schema`, with `keys` written, forces when its reader wants `want`.
fn object_next(schema: &Value, keys: &[String], want: Want) -> String {
    let properties = schema.get("properties").and_then(Value::as_object);
    let required = |name: &str| {
        schema
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(name)))
    };
    let property = |name: &str| properties.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
    // The grammar writes properties in the schema's order: the first not written yet comes
    // next, if any may.
    let next = properties.and_then(|p| p.keys().find(|k| !keys.contains(k)));
    let named = |name: &str| format!("{}:{}", Value::from(name), lead_within(property(name), 16));
    match want {
        Want::Key => match next {
            Some(name) if required(name) => named(name),
            _ => String::new(),
        },
        Want::Colon => keys
            .last()
            .map(|name| format!(":{}", lead_within(property(name), 16)))
            .unwrap_or_default(),
        Want::Value => keys
            .last()
            .map(|name| lead_within(property(name), 16))
            .unwrap_or_default(),
        Want::Next => match next {
            Some(name) if required(name) => format!(",{}", named(name)),
            Some(_) => String::new(),
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => "}".into(),
            None => String::new(),
        },
    }
}

/// Reads `written` against `schema`, leaving the containers still open on `stack`.
fn read<'s>(schema: &'s Value, written: &str, stack: &mut Vec<Frame<'s>>) -> End<'s> {
    // The schema of the value starting where the reader is.
    fn value_schema<'s>(root: &'s Value, stack: &[Frame<'s>]) -> &'s Value {
        match stack.last() {
            None => root,
            Some(top) => match &top.keys {
                Some(keys) => keys
                    .last()
                    .and_then(|k| top.schema.get("properties")?.get(k))
                    .unwrap_or(&Value::Null),
                None => top.schema.get("items").unwrap_or(&Value::Null),
            },
        }
    }
    // A value ended: its container wants what follows it.
    fn value_done(stack: &mut [Frame<'_>], done: &mut bool) {
        match stack.last_mut() {
            Some(top) => {
                if top.keys.is_none() {
                    top.count += 1;
                }
                top.want = Want::Next;
            }
            None => *done = true,
        }
    }
    let mut done = false;
    let mut string: Option<(String, bool, &Value)> = None;
    let mut scalar = false;
    let mut chars = written.chars();
    while let Some(c) = chars.next() {
        if let Some((text, _, _)) = string.as_mut() {
            match c {
                '\\' => {
                    // An escape is no label's text: such a value is left to the model.
                    let _ = chars.next();
                    text.push('\u{fffd}');
                }
                '"' => match string.take() {
                    Some((key, true, _)) => {
                        if let Some(top) = stack.last_mut() {
                            if let Some(keys) = top.keys.as_mut() {
                                keys.push(key);
                            }
                            top.want = Want::Colon;
                        }
                    }
                    _ => value_done(stack, &mut done),
                },
                other => text.push(other),
            }
            continue;
        }
        if scalar {
            if matches!(c, ',' | '}' | ']') || c.is_whitespace() {
                scalar = false;
                value_done(stack, &mut done);
            } else {
                continue;
            }
        }
        match c {
            '{' | '[' => {
                let schema = value_schema(schema, stack);
                stack.push(Frame {
                    schema,
                    keys: (c == '{').then(Vec::new),
                    count: 0,
                    want: if c == '{' { Want::Key } else { Want::Value },
                });
            }
            '}' | ']' => {
                stack.pop();
                value_done(stack, &mut done);
            }
            ',' => {
                if let Some(top) = stack.last_mut() {
                    top.want = if top.keys.is_some() {
                        Want::Key
                    } else {
                        Want::Value
                    };
                }
            }
            ':' => {
                if let Some(top) = stack.last_mut() {
                    top.want = Want::Value;
                }
            }
            '"' => {
                let is_key = stack
                    .last()
                    .is_some_and(|top| top.keys.is_some() && top.want == Want::Key);
                string = Some((String::new(), is_key, value_schema(schema, stack)));
            }
            c if c.is_whitespace() => {}
            _ => scalar = true,
        }
    }
    match (string, scalar) {
        (Some((text, is_key, value)), _) => End::Str(text, is_key, value),
        (None, true) => End::Scalar,
        (None, false) => End::Between { done },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent() -> Value {
        json!({"type": "object", "properties": {
            "intents": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
                "type": "object",
                "properties": {
                    "intent": {"type": "string", "enum": ["order_status", "other", "billing"]},
                    "confidence": {"type": "string", "enum": ["high", "low"]}},
                "required": ["intent", "confidence"],
                "additionalProperties": false}},
            "reasoning": {"type": "string", "maxLength": 200}},
            "required": ["intents", "reasoning"],
            "additionalProperties": false})
    }

    fn criterion() -> Value {
        json!({"type": "object", "properties": {
            "budget": {"type": "object", "properties": {
                "status": {"type": "string", "enum": ["identified", "not_found"]},
                "summary": {"type": "string"},
                "confidence": {"type": ["number", "null"]},
                "evidence": {"type": "array", "maxItems": 2, "items": {"type": "string"}}},
                "required": ["status", "summary", "confidence", "evidence"],
                "additionalProperties": false},
            "need": {"type": "object", "properties": {
                "status": {"type": "string", "enum": ["identified", "not_found"]}},
                "required": ["status"],
                "additionalProperties": false}},
            "required": ["budget", "need"],
            "additionalProperties": false})
    }

    #[test]
    fn an_enum_told_apart_is_finished_with_what_follows_it() {
        let s = intent();
        // "o" may still be either of two labels; "ord" only one, and then the next required
        // property is named and its enum opened.
        assert_eq!(forced_text(&s, r#"{"intents":[{"intent":"o"#), "");
        assert_eq!(
            forced_text(&s, r#"{"intents":[{"intent":"ord"#),
            r#"er_status","confidence":""#
        );
        // A finished object that allows nothing more is closed; an array that may take
        // another element is left to the model.
        assert_eq!(
            forced_text(&s, r#"{"intents":[{"intent":"other","confidence":"h"#),
            r#"igh"}"#
        );
        // The array's end, then the next property and the opening of its string.
        assert_eq!(
            forced_text(&s, r#"{"intents":[{"intent":"other","confidence":"high"}]"#),
            r#","reasoning":""#
        );
        // After a comma in an array, another element starts as its schema starts.
        assert_eq!(
            forced_text(&s, r#"{"intents":[{"intent":"other","confidence":"high"},"#),
            r#"{"intent":""#
        );
        // A full array is closed.
        assert_eq!(
            forced_text(
                &s,
                r#"{"intents":[{"intent":"other","confidence":"high"},{"intent":"billing","confidence":"low"}"#
            ),
            r#"],"reasoning":""#
        );
        // Free text is the model's; once it is closed, the object ends.
        assert_eq!(
            forced_text(
                &s,
                r#"{"intents":[{"intent":"other","confidence":"high"}],"reasoning":"It is"#
            ),
            ""
        );
        assert_eq!(
            forced_text(
                &s,
                r#"{"intents":[{"intent":"other","confidence":"high"}],"reasoning":"It is \"so\"""#
            ),
            "}"
        );
        // The answer over: nothing more.
        assert_eq!(
            forced_text(
                &s,
                r#"{"intents":[{"intent":"other","confidence":"high"}],"reasoning":"x"}"#
            ),
            ""
        );
    }

    #[test]
    fn numbers_optional_properties_and_open_arrays_are_left_to_the_model() {
        let s = criterion();
        assert_eq!(
            forced_text(&s, r#"{"budget":{"status":"identified"#),
            r#"","summary":""#
        );
        assert_eq!(
            forced_text(&s, r#"{"budget":{"status":"identified","summary":"a, b]""#),
            r#","confidence":"#
        );
        // A number is not over until what follows it.
        assert_eq!(
            forced_text(
                &s,
                r#"{"budget":{"status":"identified","summary":"a","confidence":0.9"#
            ),
            ""
        );
        assert_eq!(
            forced_text(
                &s,
                r#"{"budget":{"status":"identified","summary":"a","confidence":0.9,"#
            ),
            r#""evidence":["#
        );
        // An array that may be empty or take another element: the model's choice.
        assert_eq!(
            forced_text(
                &s,
                r#"{"budget":{"status":"identified","summary":"a","confidence":0.9,"evidence":["#
            ),
            ""
        );
        assert_eq!(
            forced_text(
                &s,
                r#"{"budget":{"status":"identified","summary":"a","confidence":0.9,"evidence":["q""#
            ),
            ""
        );
        // Full, the array closes, its object closes, the next field opens.
        assert_eq!(
            forced_text(
                &s,
                r#"{"budget":{"status":"identified","summary":"a","confidence":null,"evidence":["q","r""#
            ),
            r#"]},"need":{"status":""#
        );
        // White space the model wrote between tokens is read past.
        assert_eq!(
            forced_text(&s, "{ \"budget\" : { \"status\" : \"not"),
            r#"_found","summary":""#
        );
        // An optional next property, or an object that may hold more, forces nothing.
        let optional = json!({"type": "object", "properties": {"a": {"type": "string"},
            "b": {"type": "string"}}, "required": ["a"]});
        assert_eq!(forced_text(&optional, r#"{"a":"x""#), "");
        assert_eq!(forced_text(&optional, r#"{"a":"x","b":"y""#), "");
        // Labels that need escaping are the model's to write.
        let odd = json!({"enum": ["say \"hi\"", "no"]});
        assert_eq!(forced_text(&odd, r#""sa"#), "");
        assert_eq!(forced_text(&odd, r#""n"#), "o\"");
    }
}
