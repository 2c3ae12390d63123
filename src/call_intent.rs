//! A live call's intent analyses as its organisation's work: run on the language model as that
//! tenant (its evaluated prompts are its own), billed to its chat-token pool, and taking
//! their turn with other calls' analyses so that calls asking often cannot fill the model's
//! queue. The call's intent actor decides when to run (one at a time, spaced); this is what
//! one run does. A call with nothing transcribed yet gets the fixed answer of an empty
//! transcript, without the model and unbilled.

use std::sync::Arc;

use tokio::sync::Semaphore;

use callstream_actors::call::{IntentClassifier, IntentFuture};
use callstream_actors::usage::{Account, UsageKind, UsageSource};

use crate::llm::profiles::{analyse, has_speech, messages, Confidence, ProfileKind, LIVE_LAYOUT};
use crate::llm::{for_tenant, LlmError, Provider};
use crate::usage::Quotas;

/// Tokens reserved for one run besides its transcript: the instructions and the answer.
const RUN_TOKENS: u64 = 3_000;

/// The intent analysis of one call.
pub struct CallIntent {
    provider: Arc<dyn Provider>,
    quotas: Arc<Quotas>,
    account: Account,
    turns: Arc<Semaphore>,
}

impl CallIntent {
    /// The analyses of the call `account` pays for, on `provider`, each waiting for one of
    /// `turns` while it runs.
    pub fn new(
        provider: Arc<dyn Provider>,
        quotas: Arc<Quotas>,
        account: Account,
        turns: Arc<Semaphore>,
    ) -> Self {
        Self {
            provider: for_tenant(provider, &account.org_id, crate::llm::fair::Class::Live),
            quotas,
            account,
            turns,
        }
    }
}

/// What a run over `transcript` may use at most, in tokens (a token is at least two
/// characters of transcript).
fn reserve_for(transcript: &str) -> u64 {
    RUN_TOKENS + transcript.len() as u64 / 2
}

impl IntentClassifier for CallIntent {
    fn classify(&self, transcript: String) -> IntentFuture {
        let provider = self.provider.clone();
        let quotas = self.quotas.clone();
        let account = self.account.clone();
        let turns = self.turns.clone();
        Box::pin(async move {
            if !has_speech(&transcript) {
                // Answered without the model (see `analyse`): nothing to bill or wait for.
                return analyse(
                    provider.as_ref(),
                    ProfileKind::Intent,
                    LIVE_LAYOUT,
                    "",
                    None,
                )
                .await
                .map(|(value, _)| value)
                .map_err(|e| e.to_string());
            }
            let want = reserve_for(&transcript);
            let now = crate::clock::now_ms();
            let reservation = quotas
                .reserve_of(&account.org_id, UsageKind::Tokens, want, want, now)
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "intent analysis: the token quota cannot be read");
                    "the chat-token quota cannot be read right now".to_owned()
                })?
                .ok_or_else(|| "this organisation's chat-token quota is used up".to_owned())?;
            let _turn = turns
                .acquire_owned()
                .await
                .map_err(|_| "the service is stopping".to_owned())?;
            let analysed = analyse(
                provider.as_ref(),
                ProfileKind::Intent,
                LIVE_LAYOUT,
                &transcript,
                None,
            )
            .await;
            let (value, used) = match analysed {
                Ok((value, usage)) => (Ok(value), usage.total_tokens),
                // What the model read before it was stopped is billed all the same.
                Err(LlmError::Cancelled { usage }) => (
                    Err("the analysis was stopped".to_owned()),
                    usage.total_tokens,
                ),
                Err(e) => (Err(e.to_string()), 0),
            };
            if let Err(e) = reservation
                .settle(&account, used, UsageSource::Callstream, None)
                .await
            {
                tracing::error!(error = %e, "intent analysis tokens could not be recorded");
                return Err("usage could not be recorded; the result is withheld".to_owned());
            }
            value
        })
    }

    fn prefill(&self, transcript: String) {
        self.provider.prefill(
            messages(
                ProfileKind::Intent,
                LIVE_LAYOUT,
                Confidence::of(self.provider.as_ref()),
                &transcript,
            ),
            None,
            crate::llm::fair::Class::Live,
        );
    }
}
