//! The text every answer to a JSON schema starts with, forced before the model picks, so a
//! structured answer spends no evaluations on what it cannot choose.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::*;
use crate::llm::{Generation, LlmError};

/// The text every answer to `schema` starts with, written compactly: an object's first
/// property when it is required (the grammar keeps the schema's order of properties), then
/// the start of its value, into objects, arrays that cannot be empty, and strings (and enums
/// of strings) up to their opening quote; of `anyOf` branches, what all their starts share.
/// It ends where the schema leaves the answer open (an optional first property, a number, a
/// `$ref`...).
pub(super) fn lead_text(schema: &serde_json::Value) -> String {
    lead_within(schema, 16)
}

/// [`lead_text`] at most `depth` levels down.
pub(super) fn lead_within(schema: &serde_json::Value, depth: usize) -> String {
    let mut out = String::new();
    let mut at = schema;
    for _ in 0..depth {
        if let Some(branches) = at.get("anyOf").and_then(serde_json::Value::as_array) {
            let leads: Vec<Vec<char>> = branches
                .iter()
                .map(|b| lead_within(b, depth - 1).chars().collect())
                .collect();
            if let Some((first, rest)) = leads.split_first() {
                let shared = rest.iter().fold(first.len(), |n, other| {
                    first
                        .iter()
                        .zip(other)
                        .take(n)
                        .take_while(|(a, b)| a == b)
                        .count()
                });
                out.extend(&first[..shared]);
            }
            break;
        }
        if let Some(values) = at.get("enum").and_then(serde_json::Value::as_array) {
            if !values.is_empty() && values.iter().all(serde_json::Value::is_string) {
                out.push('"');
            }
            break;
        }
        match at.get("type").and_then(serde_json::Value::as_str) {
            Some("object") => {
                out.push('{');
                let Some((name, inner)) = at
                    .get("properties")
                    .and_then(serde_json::Value::as_object)
                    .and_then(|p| p.iter().next())
                else {
                    break;
                };
                let required = at
                    .get("required")
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(name)));
                if !required {
                    break;
                }
                out.push_str(&serde_json::Value::from(name.as_str()).to_string());
                out.push(':');
                at = inner;
            }
            Some("array") => {
                out.push('[');
                let least = at.get("minItems").and_then(serde_json::Value::as_u64);
                match at.get("items") {
                    Some(items) if least.unwrap_or(0) > 0 => at = items,
                    _ => break,
                }
            }
            Some("string") => {
                out.push('"');
                break;
            }
            _ => break,
        }
    }
    out
}

/// [`lead_text`] of the generation's schema as tokens, accepted by the picker's grammar; none
/// when the grammar would refuse one of them (checked on a grammar of its own first, as a
/// refused token cannot be taken back), or when they would not leave room for the answer.
pub(super) fn lead_tokens(
    model: &LlamaModel,
    generation: &Generation,
    schema: &serde_json::Value,
    picker: &mut Picker,
    room: usize,
) -> Result<Vec<LlamaToken>, LlmError> {
    let text = lead_text(schema);
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let lead = model.vocab().tokenize(text.as_bytes(), false, false);
    if lead.len() >= (generation.sampling.max_tokens as usize).min(room) {
        return Ok(Vec::new());
    }
    let mut probe = Picker::new(model, generation)?;
    for &token in &lead {
        if !probe.allows(token) {
            tracing::debug!(lead = %text, "the grammar refuses the answer's lead");
            return Ok(Vec::new());
        }
        probe.accept(token);
    }
    for &token in &lead {
        picker.accept(token);
    }
    Ok(lead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_starts_with_what_every_answer_to_its_schema_starts_with() {
        use serde_json::json;
        let intent = json!({"type": "object", "properties": {
            "intents": {"type": "array", "minItems": 1, "items": {"type": "object",
                "properties": {"intent": {"type": "string", "enum": ["a", "b"]},
                    "confidence": {"type": "string"}},
                "required": ["intent", "confidence"]}},
            "reasoning": {"type": "string"}}, "required": ["intents", "reasoning"]});
        assert_eq!(lead_text(&intent), r#"{"intents":[{"intent":""#);
        // Branches that differ after the status's opening quote share only that much.
        let branch = |status: &str| {
            json!({"type": "object", "properties": {"status": {"enum": [status]},
                "summary": {"type": "string"}}, "required": ["status", "summary"]})
        };
        let record = json!({"type": "object", "properties": {
            "budget": {"anyOf": [branch("identified"), branch("partial")]}},
            "required": ["budget"]});
        assert_eq!(lead_text(&record), r#"{"budget":{"status":""#);
        // Where the start is open, the lead stops before it.
        let optional = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(lead_text(&optional), "{");
        let maybe_empty = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(lead_text(&maybe_empty), "[");
        let number = json!({"type": "object", "properties": {"n": {"type": "number"}},
            "required": ["n"]});
        assert_eq!(lead_text(&number), r#"{"n":"#);
        let apart = json!({"anyOf": [{"type": "string"}, {"type": "number"}]});
        assert_eq!(lead_text(&apart), "");
        assert_eq!(lead_text(&json!({"$ref": "#/$defs/x"})), "");
        // A schema nested past any real one ends the lead; it does not recurse without end.
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"anyOf": [deep]});
        }
        assert_eq!(lead_text(&deep), "");
    }
}
