//! The profiles: each analysis's prompt, JSON schema and worked examples (the files beside
//! this one), the intent labels, and the record given when nobody spoke.
use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::record::*;

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
    /// JSON schema of the output, keys in the order the model should write them (generated
    /// from the record's type, [`schema_of`]).
    pub schema: Value,
    /// Worked examples, shown to the model as earlier turns of the conversation: a transcript
    /// and the answer to it, written compactly as the model should write its own.
    pub examples: Vec<Example>,
}

/// A transcript and the record the profile should give for it.
#[derive(Debug, Clone)]
pub struct Example {
    /// `Speaker: text` lines.
    pub transcript: String,
    /// The expected record.
    pub answer: Record,
}

/// An example as its file writes it.
#[derive(serde::Deserialize)]
struct Written<T> {
    transcript: String,
    answer: T,
}

fn examples_of<T: serde::de::DeserializeOwned>(
    text: &str,
    record: fn(T) -> Record,
) -> Vec<Example> {
    serde_json::from_str::<Vec<Written<T>>>(text)
        .expect("the profile examples are records of their profile (checked by a test)")
        .into_iter()
        .map(|w| Example {
            transcript: w.transcript,
            answer: record(w.answer),
        })
        .collect()
}

pub(super) fn load(kind: ProfileKind, prompt: &'static str, examples: &'static str) -> Profile {
    Profile {
        prompt: prompt.to_owned(),
        schema: schema_of(kind),
        examples: match kind {
            ProfileKind::Intent => examples_of(examples, Record::Intent),
            ProfileKind::Bant => examples_of(examples, Record::Bant),
            ProfileKind::NeatP => examples_of(examples, Record::NeatP),
        },
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
                kind,
                include_str!("intent.md"),
                include_str!("intent.examples.json"),
            )
        }),
        ProfileKind::Bant => BANT.get_or_init(|| {
            load(
                kind,
                include_str!("bant.md"),
                include_str!("bant.examples.json"),
            )
        }),
        ProfileKind::NeatP => NEAT_P.get_or_init(|| {
            load(
                kind,
                include_str!("neat_p.md"),
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
    for field in object_mut(&mut schema, "properties")
        .into_iter()
        .flat_map(|fields| fields.values_mut())
    {
        if let Some(properties) = object_mut(field, "properties") {
            properties.remove("confidence");
        }
        if let Some(Value::Array(required)) = field.get_mut("required") {
            required.retain(|name| name != "confidence");
        }
    }
    let examples = profile
        .examples
        .iter()
        .map(|example| {
            let mut answer = example.answer.clone();
            for (_, criterion) in answer.criteria_mut() {
                criterion.confidence = None;
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

/// The member `key` of a JSON object, when it is an object itself.
pub(super) fn object_mut<'a>(node: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    node.get_mut(key).and_then(Value::as_object_mut)
}

/// The intent labels of the intent profile, in its schema's order.
pub fn intent_labels() -> &'static [String] {
    static LABELS: OnceLock<Vec<String>> = OnceLock::new();
    LABELS.get_or_init(|| {
        profile(ProfileKind::Intent)
            .schema
            .pointer("/properties/intents/items/properties/intent/enum")
            .and_then(Value::as_array)
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
pub fn no_speech_record(kind: ProfileKind) -> Record {
    let none = || Criterion {
        status: Status::NotFound,
        summary: NO_SPEECH.to_owned(),
        confidence: Some(0.0),
        evidence: Vec::new(),
    };
    match kind {
        ProfileKind::Intent => Record::Intent(IntentRecord {
            intents: vec![Intent {
                intent: IntentLabel::Other,
                confidence: Level::Low,
            }],
            reasoning: NO_SPEECH.to_owned(),
        }),
        ProfileKind::Bant => Record::Bant(Bant {
            budget: none(),
            authority: none(),
            need: none(),
            timeline: none(),
        }),
        ProfileKind::NeatP => Record::NeatP(NeatP {
            need: none(),
            economic_impact: none(),
            access_to_authority: none(),
            timeline: none(),
            priority: none(),
        }),
    }
}
