//! How the messages of an analysis are laid out: a file's three analyses share one prompt,
//! a live call's intent has its profile's alone.
use std::sync::OnceLock;

use super::*;
use crate::llm::{Message, Role};

/// Where a prompt puts the transcript: what the model can keep evaluated between requests
/// depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The profile's instructions and worked examples, then the transcript. A transcript that
    /// grows (a live call) only adds tokens at the end, so each analysis evaluates only the new
    /// lines. The layout of a live call's intent analyses ([`LIVE_LAYOUT`]).
    InstructionsFirst,
    /// The instructions and worked examples of all three profiles, the transcript, then the
    /// name of the task. Everything but the last few tokens is the same for the three analyses
    /// of one transcript, so the transcript is evaluated once for all of them, and what comes
    /// before it is the same for every transcript. The layout of `POST /api/transcribe`'s
    /// analyses ([`FILE_LAYOUT`]).
    Shared,
}

/// How an uploaded file's analyses are prompted.
pub const FILE_LAYOUT: Layout = Layout::Shared;

/// How a live call's intent analyses are prompted: only the intent profile's instructions
/// come before the transcript, so the prompt a call keeps between its analyses stays short.
pub const LIVE_LAYOUT: Layout = Layout::InstructionsFirst;

impl ProfileKind {
    /// All profiles, in the order of [`Layout::Shared`]'s instructions.
    pub const ALL: [ProfileKind; 3] = [ProfileKind::Intent, ProfileKind::Bant, ProfileKind::NeatP];

    /// The task's name in [`Layout::Shared`] prompts (the response field it fills).
    pub fn task(self) -> &'static str {
        match self {
            ProfileKind::Intent => "intent",
            ProfileKind::Bant => "bant",
            ProfileKind::NeatP => "neat_p",
        }
    }
}

/// The system prompt of [`Layout::Shared`]: every profile's instructions under its task name.
pub(super) fn shared_instructions(confidence: Confidence) -> &'static str {
    static WRITTEN: OnceLock<String> = OnceLock::new();
    static WEIGHED: OnceLock<String> = OnceLock::new();
    let text = match confidence {
        Confidence::Written => &WRITTEN,
        Confidence::Weighed => &WEIGHED,
    };
    text.get_or_init(|| {
        let mut text = String::from(
            "You analyse contact-center call and chat transcripts. Each user message is a \
             transcript followed by one task: intent, bant or neat_p. Do that task alone, as its \
             section below says, and answer only with its JSON.",
        );
        for kind in ProfileKind::ALL {
            text.push_str("\n\n# Task: ");
            text.push_str(kind.task());
            text.push_str("\n\n");
            text.push_str(profile_for(kind, confidence).prompt.trim_end());
        }
        text
    })
}

/// The last user message of a [`Layout::Shared`] prompt: the transcript, then the task.
pub(super) fn shared_request(kind: ProfileKind, transcript: &str) -> String {
    format!(
        "Transcript:\n{}\n\nTask: {}",
        transcript.trim_end(),
        kind.task()
    )
}

/// The conversation that asks for analysis `kind` of `transcript`. The worked examples come
/// between the instructions and the transcript, as earlier turns: with
/// [`Layout::InstructionsFirst`] everything before the transcript is the same for every
/// request of the profile, with [`Layout::Shared`] for every request of any profile. The
/// instructions and examples are those of `confidence` ([`profile_for`]).
pub fn messages(
    kind: ProfileKind,
    layout: Layout,
    confidence: Confidence,
    transcript: &str,
) -> Vec<Message> {
    let profile = profile_for(kind, confidence);
    match layout {
        Layout::InstructionsFirst => {
            let mut messages = vec![Message::new(Role::System, profile.prompt.as_str())];
            for example in &profile.examples {
                messages.push(Message::new(
                    Role::User,
                    format!("Transcript:\n{}", example.transcript),
                ));
                messages.push(Message::new(Role::Assistant, example.answer.to_json()));
            }
            messages.push(Message::new(
                Role::User,
                format!("Transcript:\n{transcript}"),
            ));
            messages
        }
        Layout::Shared => {
            let mut messages = vec![Message::new(Role::System, shared_instructions(confidence))];
            for shown in ProfileKind::ALL {
                for example in &profile_for(shown, confidence).examples {
                    messages.push(Message::new(
                        Role::User,
                        shared_request(shown, &example.transcript),
                    ));
                    messages.push(Message::new(Role::Assistant, example.answer.to_json()));
                }
            }
            messages.push(Message::new(Role::User, shared_request(kind, transcript)));
            messages
        }
    }
}

/// The starts that analyses share, for warming a model up: the live intent prompt up to the
/// transcript, the file analyses' prompt up to the transcript, and the check of BANT and
/// NEAT-P findings up to its question, for a model whose records get their confidence from
/// `confidence`.
pub fn warm_ups(confidence: Confidence) -> [Vec<Message>; 3] {
    [
        messages(ProfileKind::Intent, LIVE_LAYOUT, confidence, ""),
        messages(ProfileKind::Intent, FILE_LAYOUT, confidence, ""),
        check::instructions(),
    ]
}
