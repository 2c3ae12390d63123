//! The profiles: each analysis's prompt, JSON schema and worked examples (the files beside
//! this one), the intent labels, and the record given when nobody spoke.
use std::sync::OnceLock;

use serde_json::Value;

use crate::llm::Provider;

/// The analyses the service runs over transcripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// Customer intent (spec 2.6 shape).
    Intent,
    /// Budget, authority, need, timeline.
    Bant,
    /// Need, economic impact, access to authority, timeline, priority.
    NeatP,
}

/// A profile: its instructions, output schema and worked examples.
#[derive(Debug)]
pub struct Profile {
    /// System prompt.
    pub prompt: String,
    /// JSON schema of the output, keys in the order the model should write them.
    pub schema: Value,
    /// Worked examples, shown to the model as earlier turns of the conversation: a transcript
    /// and the answer to it, written compactly as the model should write its own.
    pub examples: Vec<Example>,
}

/// A transcript and the record the profile should give for it.
#[derive(Debug, serde::Deserialize)]
pub struct Example {
    /// `Speaker: text` lines.
    pub transcript: String,
    /// The expected record.
    pub answer: Value,
}

pub(super) fn load(prompt: &'static str, schema: &'static str, examples: &'static str) -> Profile {
    Profile {
        prompt: prompt.to_owned(),
        schema: serde_json::from_str(schema)
            .expect("the profile schemas are valid JSON (checked by a test)"),
        examples: serde_json::from_str(examples)
            .expect("the profile examples are valid JSON (checked by a test)"),
    }
}

/// The profile of `kind`.
pub fn profile(kind: ProfileKind) -> &'static Profile {
    static INTENT: OnceLock<Profile> = OnceLock::new();
    static BANT: OnceLock<Profile> = OnceLock::new();
    static NEAT_P: OnceLock<Profile> = OnceLock::new();
    match kind {
        ProfileKind::Intent => INTENT.get_or_init(|| {
            load(
                include_str!("intent.md"),
                include_str!("intent.json"),
                include_str!("intent.examples.json"),
            )
        }),
        ProfileKind::Bant => BANT.get_or_init(|| {
            load(
                include_str!("bant.md"),
                include_str!("bant.json"),
                include_str!("bant.examples.json"),
            )
        }),
        ProfileKind::NeatP => NEAT_P.get_or_init(|| {
            load(
                include_str!("neat_p.md"),
                include_str!("neat_p.json"),
                include_str!("neat_p.examples.json"),
            )
        }),
    }
}

/// Where the confidence of a record's fields comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confidence {
    /// The model writes it, as its instructions and worked examples show (a model that tells
    /// no odds: an upstream one).
    Written,
    /// A BANT or NEAT-P field's confidence is the probability the model gave its status where
    /// it wrote it ([`weigh_statuses`]), so the model is neither asked for one nor shown one in
    /// the worked examples: about 60 tokens fewer to write per file (the embedded model). An
    /// intent's level is weighed as well ([`weigh_intents`]), but the model still writes one
    /// (a few tokens): the intent profile is shown as it was measured, on live calls too.
    Weighed,
}

impl Confidence {
    /// Where `provider`'s records get their confidence.
    pub fn of(provider: &dyn Provider) -> Self {
        if provider.gives_odds() {
            Confidence::Weighed
        } else {
            Confidence::Written
        }
    }
}

/// The profile of `kind` as the model is shown it when its records' `confidence` comes from
/// `confidence`: for [`Confidence::Weighed`], BANT and NEAT-P without the field's
/// `confidence` in the instructions, the schema and the worked examples.
pub fn profile_for(kind: ProfileKind, confidence: Confidence) -> &'static Profile {
    static BANT: OnceLock<Profile> = OnceLock::new();
    static NEAT_P: OnceLock<Profile> = OnceLock::new();
    match (kind, confidence) {
        (ProfileKind::Intent, _) | (_, Confidence::Written) => profile(kind),
        (ProfileKind::Bant, Confidence::Weighed) => {
            BANT.get_or_init(|| without_confidence(profile(kind)))
        }
        (ProfileKind::NeatP, Confidence::Weighed) => {
            NEAT_P.get_or_init(|| without_confidence(profile(kind)))
        }
    }
}

/// The line of a BANT or NEAT-P prompt that asks for each field's confidence.
pub(super) const CONFIDENCE_LINE: &str = "- confidence:";

/// `profile` (BANT or NEAT-P) without its fields' `confidence`: not asked for in the prompt
/// (the line starting [`CONFIDENCE_LINE`]), not in the schema, not in the examples' answers.
pub(super) fn without_confidence(profile: &Profile) -> Profile {
    let prompt = profile
        .prompt
        .lines()
        .filter(|line| !line.starts_with(CONFIDENCE_LINE))
        .collect::<Vec<_>>()
        .join("\n");
    let mut schema = profile.schema.clone();
    if let Some(fields) = schema["properties"].as_object_mut() {
        for field in fields.values_mut() {
            if let Some(properties) = field["properties"].as_object_mut() {
                properties.remove("confidence");
            }
            if let Some(required) = field["required"].as_array_mut() {
                required.retain(|name| name != "confidence");
            }
        }
    }
    let examples = profile
        .examples
        .iter()
        .map(|example| {
            let mut answer = example.answer.clone();
            if let Some(fields) = answer.as_object_mut() {
                for field in fields.values_mut() {
                    if let Some(field) = field.as_object_mut() {
                        field.remove("confidence");
                    }
                }
            }
            Example {
                transcript: example.transcript.clone(),
                answer,
            }
        })
        .collect();
    Profile {
        prompt: prompt + "\n",
        schema,
        examples,
    }
}

/// The intent labels of the intent profile, in its schema's order (read from it once).
pub fn intent_labels() -> &'static [String] {
    static LABELS: OnceLock<Vec<String>> = OnceLock::new();
    LABELS.get_or_init(|| {
        profile(ProfileKind::Intent).schema["properties"]["intents"]["items"]["properties"]
            ["intent"]["enum"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// Why a record was not asked of the model.
pub(super) const NO_SPEECH: &str = "No speech was detected, so there is nothing to analyse.";

/// The fixed record of `kind` for a transcript without speech: intent `other` with `low`
/// confidence; every BANT / NEAT-P field `not_found`, without evidence.
pub fn no_speech_record(kind: ProfileKind) -> Value {
    if kind == ProfileKind::Intent {
        return serde_json::json!({
            "intents": [{"intent": "other", "confidence": "low"}],
            "reasoning": NO_SPEECH,
        });
    }
    let fields = profile(kind).schema["properties"]
        .as_object()
        .map(|props| {
            props
                .keys()
                .map(|k| {
                    (
                        k.clone(),
                        serde_json::json!({"status": "not_found", "summary": NO_SPEECH,
                            "confidence": 0.0, "evidence": []}),
                    )
                })
                .collect::<serde_json::Map<String, Value>>()
        })
        .unwrap_or_default();
    Value::Object(fields)
}
