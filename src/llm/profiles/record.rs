//! The records the analyses give, as types. Their JSON schemas (what the embedded model's
//! grammar holds it to, and the `response_format` an upstream model is sent) are generated
//! from these types ([`schema_of`]); the field order of each struct is the order the model
//! writes the fields in (serde_json's `preserve_order` keeps it in the schema).
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ProfileKind;

/// Longest summary of a criterion.
pub const SUMMARY_CHARS: usize = 160;

/// A customer-intent record (spec 2.6 shape): up to three intents, the main one first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntentRecord {
    #[schemars(length(min = 1, max = 3))]
    pub intents: Vec<Intent>,
    #[schemars(length(max = 200))]
    pub reasoning: String,
}

/// One intent and how sure the analysis is of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    pub intent: IntentLabel,
    pub confidence: Level,
}

/// The intent labels, in the order the model is offered them. `other` is for a contact none
/// of the others fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IntentLabel {
    BillingInquiry,
    PaymentIssue,
    OrderStatus,
    DeliveryProblem,
    Cancellation,
    RefundRequest,
    TechnicalSupport,
    AccountManagement,
    ProductInquiry,
    PurchaseIntent,
    Complaint,
    AppointmentScheduling,
    GeneralInquiry,
    Other,
}

impl IntentLabel {
    /// The label as written in a record.
    pub fn name(self) -> String {
        written(self)
    }
}

/// A unit enum's value as serde writes it.
fn written(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// How sure: `high`, `medium` or `low`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    High,
    Medium,
    Low,
}

/// What the call said of a criterion: `identified` (the buyer stated it), `partial` (hinted
/// at, or stated by someone else) or `not_found`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Identified,
    Partial,
    NotFound,
}

impl Status {
    /// Every status, in the schemas' order.
    pub const ALL: [Status; 3] = [Status::Identified, Status::Partial, Status::NotFound];

    /// The status as written in a record.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Identified => "identified",
            Status::Partial => "partial",
            Status::NotFound => "not_found",
        }
    }
}

/// One BANT or NEAT-P criterion. `confidence` is required of a model that writes it
/// ([`super::Confidence::Written`]); for one whose odds are weighed it is left out of the
/// schema and set from the odds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Criterion {
    pub status: Status,
    #[schemars(length(max = SUMMARY_CHARS))]
    pub summary: String,
    #[schemars(required)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[schemars(length(max = 2), inner(length(max = super::QUOTE_CHARS)))]
    pub evidence: Vec<String>,
}

/// Budget, authority, need, timeline. The field docs are the descriptions the model reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bant {
    /// money available or planned for a purchase
    pub budget: Criterion,
    /// who decides or signs off
    pub authority: Criterion,
    /// the problem or requirement to be solved
    pub need: Criterion,
    /// when a decision or purchase will happen
    pub timeline: Criterion,
}

/// Need, economic impact, access to authority, timeline, priority. The field docs are the
/// descriptions the model reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NeatP {
    /// the core problem and why it matters to the buyer
    pub need: Criterion,
    /// measurable cost of the problem or value of solving it
    pub economic_impact: Criterion,
    /// whether the speaker is or can reach the economic buyer
    pub access_to_authority: Criterion,
    /// events or deadlines that force a decision
    pub timeline: Criterion,
    /// where this ranks among the buyer's other initiatives
    pub priority: Criterion,
}

/// A record of any profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Record {
    /// Customer intent.
    Intent(IntentRecord),
    /// BANT.
    Bant(Bant),
    /// NEAT-P.
    NeatP(NeatP),
}

impl Record {
    /// Reads a `kind` record from JSON; the error names the field that does not fit.
    pub fn parse(kind: ProfileKind, text: &str) -> Result<Record, String> {
        fn read<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
            let mut de = serde_json::Deserializer::from_str(text);
            let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let path = e.path().to_string();
                format!("{path}: {}", e.into_inner())
            })?;
            de.end().map_err(|e| e.to_string())?;
            Ok(value)
        }
        Ok(match kind {
            ProfileKind::Intent => Record::Intent(read(text)?),
            ProfileKind::Bant => Record::Bant(read(text)?),
            ProfileKind::NeatP => Record::NeatP(read(text)?),
        })
    }

    /// The record as compact JSON text, as the model writes one.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("records are plain data")
    }

    /// The record as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("records are plain data")
    }

    /// The intent record, if this is one.
    pub fn intent(&self) -> Option<&IntentRecord> {
        match self {
            Record::Intent(r) => Some(r),
            _ => None,
        }
    }

    /// A BANT or NEAT-P record's criteria by field name, in the record's order (none for an
    /// intent record).
    pub fn criteria(&self) -> Vec<(&'static str, &Criterion)> {
        match self {
            Record::Intent(_) => Vec::new(),
            Record::Bant(b) => vec![
                ("budget", &b.budget),
                ("authority", &b.authority),
                ("need", &b.need),
                ("timeline", &b.timeline),
            ],
            Record::NeatP(n) => vec![
                ("need", &n.need),
                ("economic_impact", &n.economic_impact),
                ("access_to_authority", &n.access_to_authority),
                ("timeline", &n.timeline),
                ("priority", &n.priority),
            ],
        }
    }

    /// [`Record::criteria`], to change.
    pub fn criteria_mut(&mut self) -> Vec<(&'static str, &mut Criterion)> {
        match self {
            Record::Intent(_) => Vec::new(),
            Record::Bant(b) => vec![
                ("budget", &mut b.budget),
                ("authority", &mut b.authority),
                ("need", &mut b.need),
                ("timeline", &mut b.timeline),
            ],
            Record::NeatP(n) => vec![
                ("need", &mut n.need),
                ("economic_impact", &mut n.economic_impact),
                ("access_to_authority", &mut n.access_to_authority),
                ("timeline", &mut n.timeline),
                ("priority", &mut n.priority),
            ],
        }
    }
}

/// The JSON schema a `kind` record is held to: generated from its type, every reference
/// written out, with the descriptions of the top-level fields only (the rest of the types'
/// docs are for readers of this code, not for the model).
pub fn schema_of(kind: ProfileKind) -> Value {
    let schema = match kind {
        ProfileKind::Intent => generate::<IntentRecord>(),
        ProfileKind::Bant => generate::<Bant>(),
        ProfileKind::NeatP => generate::<NeatP>(),
    };
    let mut value = schema.to_value();
    tidy(&mut value, true);
    value
}

fn generate<T: JsonSchema>() -> Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .into_generator()
        .into_root_schema_for::<T>()
}

/// Drops what the model has no use for from a generated schema: titles, number formats, and
/// descriptions but those of the root's properties (`root` is true at the root).
fn tidy(node: &mut Value, root: bool) {
    let Some(map) = node.as_object_mut() else {
        if let Some(items) = node.as_array_mut() {
            items.iter_mut().for_each(|n| tidy(n, false));
        }
        return;
    };
    map.remove("title");
    map.remove("format");
    map.remove("description");
    for (key, child) in map.iter_mut() {
        if key == "properties" && root {
            if let Some(props) = child.as_object_mut() {
                for prop in props.values_mut() {
                    let kept = prop.get("description").cloned();
                    tidy(prop, false);
                    if let (Some(d), Some(p)) = (kept, prop.as_object_mut()) {
                        p.insert("description".into(), d);
                    }
                }
            }
        } else {
            tidy(child, false);
        }
    }
}
