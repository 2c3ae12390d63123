//! Analysis profiles: intent, BANT and NEAT-P. Each is a prompt and a JSON schema (files in
//! `src/llm/profiles/`): the prompt is the system message, the transcript the user message. The
//! model's output is constrained by the schema (a grammar on the embedded model,
//! `response_format` upstream), so it always parses. Evidence quotes are then checked against
//! the transcript and any that do not occur in it verbatim are dropped.
//!
//! The embedded model keeps evaluated prompts for reuse (`embedded::PrefixCache`): a profile's
//! system prompt is evaluated once, and on a live call each `analyze` evaluates only the part of
//! the transcript that is new since the call's last analysis.

use std::sync::{Arc, OnceLock};

use callstream_actors::call::{IntentClassifier, IntentFuture};
use serde_json::Value;

use super::{Generation, LlmError, Message, Provider, Role, Sampling, Usage};

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

/// A profile: its instructions and output schema.
#[derive(Debug)]
pub struct Profile {
    /// System prompt.
    pub prompt: &'static str,
    /// JSON schema of the output, keys in the order the model should write them.
    pub schema: Value,
}

fn load(prompt: &'static str, schema: &'static str) -> Profile {
    Profile {
        prompt,
        schema: serde_json::from_str(schema)
            .expect("the profile schemas are valid JSON (checked by a test)"),
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
                include_str!("profiles/intent.md"),
                include_str!("profiles/intent.json"),
            )
        }),
        ProfileKind::Bant => BANT.get_or_init(|| {
            load(
                include_str!("profiles/bant.md"),
                include_str!("profiles/bant.json"),
            )
        }),
        ProfileKind::NeatP => NEAT_P.get_or_init(|| {
            load(
                include_str!("profiles/neat_p.md"),
                include_str!("profiles/neat_p.json"),
            )
        }),
    }
}

/// The intent labels of the intent profile.
pub fn intent_labels() -> Vec<String> {
    profile(ProfileKind::Intent).schema["properties"]["intents"]["items"]["properties"]["intent"]
        ["enum"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Why a record was not asked of the model.
const NO_SPEECH: &str = "No speech was detected, so there is nothing to analyse.";

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

/// Runs a profile over `transcript` (one line per utterance, `Speaker: text`). A transcript
/// in which nobody said anything gets [`no_speech_record`] without asking the model, which
/// would otherwise invent an answer.
pub async fn analyse(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
) -> Result<(Value, Usage), LlmError> {
    analyse_checked(provider, kind, layout, transcript)
        .await
        .map(|a| (a.record, a.usage))
}

/// [`analyse`], also telling how many evidence quotes the model gave and kept.
pub async fn analyse_checked(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
) -> Result<Analysis, LlmError> {
    let spoken = transcript.lines().any(|l| {
        l.split_once(": ")
            .map_or(!l.trim().is_empty(), |(_, text)| !text.trim().is_empty())
    });
    if !spoken {
        return Ok(Analysis {
            record: no_speech_record(kind),
            usage: Usage::default(),
            quotes: Quotes::default(),
        });
    }
    let profile = profile(kind);
    let generation = Generation {
        messages: messages(kind, layout, transcript),
        tools: Vec::new(),
        sampling: Sampling {
            // Enough for the longest record the schema allows (its strings are bounded).
            max_tokens: 2048,
            temperature: 0.0,
            ..Sampling::default()
        },
        json_schema: Some(profile.schema.clone()),
    };
    let completion = provider.generate(generation, None).await?;
    let mut value: Value = serde_json::from_str(completion.text.trim()).map_err(|e| {
        let tail: String = completion
            .text
            .chars()
            .rev()
            .take(200)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        LlmError::Engine(format!(
            "the {kind:?} analysis is not valid JSON ({e}; {:?}, ends {tail:?})",
            completion.finish
        ))
    })?;
    let quotes = if kind == ProfileKind::Intent {
        Quotes::default()
    } else {
        verify_evidence(&mut value, transcript)
    };
    Ok(Analysis {
        record: value,
        usage: completion.usage,
        quotes,
    })
}

/// Where a prompt puts the transcript: what the model can keep evaluated between requests
/// depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The profile's instructions, then the transcript. A transcript that grows (a live call)
    /// only adds tokens at the end, so each analysis evaluates only the new lines.
    InstructionsFirst,
    /// A short system prompt every profile shares, the transcript, then the profile's
    /// instructions. Several analyses of one transcript evaluate it once and each adds only its
    /// instructions. Measured (`callstream bench analysis --layout transcript-first`), not used
    /// by the service: the 0.5B no longer finds anything in the transcript this way.
    TranscriptFirst,
}

/// The system prompt of [`Layout::TranscriptFirst`].
const SHARED_SYSTEM: &str = "You analyse contact-center conversations. The user gives you a \
transcript, then a task about it. Answer only with JSON.";

/// The conversation that asks for analysis `kind` of `transcript`.
pub fn messages(kind: ProfileKind, layout: Layout, transcript: &str) -> Vec<Message> {
    let prompt = profile(kind).prompt;
    match layout {
        Layout::InstructionsFirst => vec![
            Message::new(Role::System, prompt),
            Message::new(Role::User, format!("Transcript:\n{transcript}")),
        ],
        Layout::TranscriptFirst => vec![
            Message::new(Role::System, SHARED_SYSTEM),
            Message::new(
                Role::User,
                format!("Transcript:\n{transcript}\n\nTask, about the transcript above:\n{prompt}"),
            ),
        ],
    }
}

/// The start every live intent analysis shares, for warming a model up: the intent prompt
/// and the transcript's heading.
pub fn warm_up_messages() -> Vec<Message> {
    messages(ProfileKind::Intent, Layout::InstructionsFirst, "")
}

/// Evidence quotes of a record: how many the model gave and how many of them occur verbatim
/// in the transcript (the others are dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quotes {
    /// Quotes the model gave.
    pub given: usize,
    /// Of those, quotes found in the transcript.
    pub verbatim: usize,
}

/// The result of one analysis.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// The record (quotes checked).
    pub record: Value,
    /// Tokens spent.
    pub usage: Usage,
    /// The evidence quotes, before the check.
    pub quotes: Quotes,
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The speaker labels of a transcript whose lines read `Speaker: text`.
fn speaker_labels(transcript: &str) -> Vec<String> {
    let mut labels: Vec<String> = transcript
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(who, _)| who.trim().to_owned()))
        .filter(|who| !who.is_empty() && who.len() <= 32 && who.split_whitespace().count() <= 3)
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

fn strip_label<'a>(s: &'a str, labels: &[String]) -> &'a str {
    labels
        .iter()
        .find_map(|l| {
            s.strip_prefix(l.as_str())
                .and_then(|rest| rest.strip_prefix(": "))
        })
        .unwrap_or(s)
}

/// Keeps only evidence quotes that occur verbatim in what was said in `transcript` (its lines
/// read `Speaker: text`; a quote that carries a speaker label loses it; runs of white space
/// count as one space; quote marks around a quote are removed) and writes them in that exact
/// form, so each is a substring of the transcript text. Confidences are clamped to 0..1; a
/// criterion marked identified that is left with no evidence becomes partial. Returns how many
/// quotes there were and how many were kept.
pub fn verify_evidence(record: &mut Value, transcript: &str) -> Quotes {
    let labels = speaker_labels(transcript);
    let spoken: Vec<&str> = transcript
        .lines()
        .map(|l| strip_label(l, &labels))
        .collect();
    let haystack = normalise(&spoken.join(" "));
    let mut quotes = Quotes::default();
    let Some(criteria) = record.as_object_mut() else {
        return quotes;
    };
    for criterion in criteria.values_mut() {
        let Some(c) = criterion.as_object_mut() else {
            continue;
        };
        if let Some(Value::Array(given)) = c.get_mut("evidence") {
            let kept: Vec<Value> = given
                .iter()
                .filter_map(Value::as_str)
                .map(|q| {
                    q.trim()
                        .trim_matches(|ch| matches!(ch, '"' | '\'' | '“' | '”'))
                })
                .map(|q| normalise(strip_label(q, &labels)))
                .filter(|q| !q.is_empty() && haystack.contains(q.as_str()))
                .map(Value::from)
                .collect();
            quotes.given += given.len();
            quotes.verbatim += kept.len();
            *given = kept;
        }
        let no_evidence = c
            .get("evidence")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if no_evidence && c.get("status").and_then(Value::as_str) == Some("identified") {
            c.insert("status".into(), Value::from("partial"));
        }
        if let Some(conf) = c.get("confidence").and_then(Value::as_f64) {
            c.insert(
                "confidence".into(),
                Value::from((conf.clamp(0.0, 1.0) * 100.0).round() / 100.0),
            );
        }
    }
    quotes
}

/// The intent profile of the language model, as the engine's [`IntentClassifier`].
pub struct LlmIntent {
    provider: Arc<dyn Provider>,
}

impl LlmIntent {
    /// Classifies with `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Self { provider }
    }
}

impl IntentClassifier for LlmIntent {
    fn classify(&self, transcript: String) -> IntentFuture {
        let provider = self.provider.clone();
        Box::pin(async move {
            analyse(
                provider.as_ref(),
                ProfileKind::Intent,
                Layout::InstructionsFirst,
                &transcript,
            )
            .await
            .map(|(value, _usage)| value)
            .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that must not be asked.
    struct Untouchable;

    #[async_trait::async_trait]
    impl Provider for Untouchable {
        async fn generate(
            &self,
            _: Generation,
            _: super::super::Deltas,
        ) -> Result<super::super::Completion, LlmError> {
            Err(LlmError::Engine("the model was asked".into()))
        }

        fn name(&self) -> &str {
            "untouchable"
        }
    }

    #[tokio::test]
    async fn a_transcript_without_speech_gets_the_fixed_record_without_the_model() {
        for transcript in ["", "\n", "Customer: \nAgent:  \n"] {
            for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
                let (record, usage) =
                    analyse(&Untouchable, kind, Layout::TranscriptFirst, transcript)
                        .await
                        .unwrap();
                assert_eq!(record, no_speech_record(kind));
                assert_eq!(usage, Usage::default());
            }
        }
        let intent = no_speech_record(ProfileKind::Intent);
        assert_eq!(intent["intents"][0]["intent"], "other");
        assert_eq!(intent["intents"][0]["confidence"], "low");
        let bant = no_speech_record(ProfileKind::Bant);
        let fields: Vec<&String> = bant.as_object().unwrap().keys().collect();
        assert_eq!(fields, ["budget", "authority", "need", "timeline"]);
        assert!(bant
            .as_object()
            .unwrap()
            .values()
            .all(|f| f["status"] == "not_found" && f["evidence"] == serde_json::json!([])));
        assert_eq!(
            no_speech_record(ProfileKind::NeatP)
                .as_object()
                .unwrap()
                .len(),
            5
        );
        // Speech goes to the model.
        assert!(analyse(
            &Untouchable,
            ProfileKind::Intent,
            Layout::InstructionsFirst,
            "Customer: hello\n",
        )
        .await
        .is_err());
    }

    #[test]
    fn profiles_load_and_keep_key_order() {
        for kind in [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP] {
            let p = profile(kind);
            assert!(p.schema.is_object() && !p.prompt.is_empty());
        }
        let keys: Vec<&String> = profile(ProfileKind::NeatP).schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            keys,
            [
                "need",
                "economic_impact",
                "access_to_authority",
                "timeline",
                "priority"
            ]
        );
        assert_eq!(intent_labels().len(), 14);
        assert!(intent_labels().contains(&"order_status".to_owned()));
    }

    #[test]
    fn evidence_must_occur_in_the_transcript() {
        let transcript = "Customer: We have about fifty thousand dollars set aside.\nAgent: Great.";
        let mut record = serde_json::json!({
            "budget": {"status": "identified", "summary": "50k", "confidence": 1.4,
                       "evidence": ["\"We have about fifty  thousand dollars\"", "we have about fifty thousand", "a million dollars",
                                    "Customer: set aside.", "Customer: We have about fifty thousand dollars set aside. Agent: Great."]},
            "timeline": {"status": "identified", "summary": "soon", "confidence": 0.5,
                         "evidence": ["next week"]}
        });
        let quotes = verify_evidence(&mut record, transcript);
        assert_eq!(
            quotes,
            Quotes {
                given: 6,
                verbatim: 2
            }
        );
        // A speaker label is not part of what was said: it is removed, and a quote that runs
        // across two speakers' lines is not verbatim.
        assert_eq!(
            record["budget"]["evidence"],
            serde_json::json!(["We have about fifty thousand dollars", "set aside."])
        );
        assert_eq!(record["budget"]["confidence"], 1.0);
        assert_eq!(record["budget"]["status"], "identified");
        assert_eq!(record["timeline"]["evidence"], serde_json::json!([]));
        assert_eq!(record["timeline"]["status"], "partial");
    }
}
