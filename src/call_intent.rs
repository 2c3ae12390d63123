//! A live call's intent analyses as its organisation's work: run on the language model as that
//! tenant (its evaluated prompts are its own), billed to its chat-token pool, and taking
//! their turn with other calls' analyses so that calls asking often cannot fill the model's
//! queue. The call's intent actor decides when to run (one at a time, spaced); this is what
//! one run does. A call with nothing transcribed yet gets the fixed answer of an empty
//! transcript, without the model and unbilled.
//!
//! Between runs the model reads the call's transcript ahead, line by line, so that the next
//! `analyze` finds it read: after the call's first `analyze` as live work, and before it,
//! after chats and before files' prompts (an organisation's warm-up of the batch class), for
//! the few calls that hold one of the instance's places for it
//! ([`ReadyPlaces`]), since reading every call's transcript would take the model from
//! everyone for calls that may never ask.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use callstream_actors::call::{IntentClassifier, IntentFuture};
use callstream_actors::usage::{Account, UsageKind, UsageSource};

use crate::llm::profiles::{analyse, has_speech, messages, Confidence, ProfileKind, LIVE_LAYOUT};
use crate::llm::{for_tenant, LlmError, Provider};
use crate::usage::Quotas;

/// Tokens reserved for one run besides its transcript: the instructions and the answer.
const RUN_TOKENS: u64 = 3_000;

/// How long after one of its calls was refused a place an organisation counts as waiting
/// for one ([`ReadyPlaces`]).
const WAITING_FOR_A_PLACE: Duration = Duration::from_secs(60);

/// The instance's places for calls whose transcript the model reads ahead before they have
/// asked for their intent (`calls.ready_before_analyze`). A call takes one at its first line
/// if one is free and holds it until it asks (from then on it is read ahead as live work) or
/// ends. While another organisation's call has been refused one within the last minute, an
/// organisation holding half of them or more (rounded up) gets no more: one busy organisation
/// cannot keep the places from the others, and alone it may use them all.
#[derive(Debug)]
pub struct ReadyPlaces {
    cap: usize,
    state: Mutex<ReadyState>,
}

#[derive(Debug, Default)]
struct ReadyState {
    /// Places held, by organisation.
    held: HashMap<String, usize>,
    /// When a call of each organisation was last refused a place.
    refused: HashMap<String, Instant>,
}

/// A place held by one call; given back when dropped.
#[derive(Debug)]
pub struct ReadyPlace {
    places: Arc<ReadyPlaces>,
    org: String,
}

impl ReadyPlaces {
    /// `cap` places in all (0: no call is read ahead before it asks).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            state: Mutex::default(),
        })
    }

    /// A place for a call of `org` at `now`, if the rules above give it one.
    pub fn take(self: &Arc<Self>, org: &str, now: Instant) -> Option<ReadyPlace> {
        let mut state = self.state.lock();
        state
            .refused
            .retain(|_, at| now.saturating_duration_since(*at) < WAITING_FOR_A_PLACE);
        let total: usize = state.held.values().sum();
        let mine = state.held.get(org).copied().unwrap_or(0);
        let others_wait = state.refused.keys().any(|o| o != org);
        let share = if others_wait {
            self.cap.div_ceil(2)
        } else {
            self.cap
        };
        if total >= self.cap || mine >= share {
            state.refused.insert(org.to_owned(), now);
            return None;
        }
        *state.held.entry(org.to_owned()).or_default() += 1;
        state.refused.remove(org);
        Some(ReadyPlace {
            places: self.clone(),
            org: org.to_owned(),
        })
    }

    /// Places held now, in all.
    pub fn held(&self) -> usize {
        self.state.lock().held.values().sum()
    }
}

impl Drop for ReadyPlace {
    fn drop(&mut self) {
        let mut state = self.places.state.lock();
        if let Some(n) = state.held.get_mut(&self.org) {
            *n -= 1;
            if *n == 0 {
                state.held.remove(&self.org);
            }
        }
    }
}

/// Whether a call holds a place, or has not tried for one, or has asked.
#[derive(Debug)]
enum Ahead {
    /// No place yet: each new line tries again.
    Without,
    /// Read ahead at the batch class's turn, for as long as the place is held.
    Holding { _place: ReadyPlace },
    /// The call has asked: read ahead as live work, no place needed.
    Asked,
}

/// The intent analysis of one call.
pub struct CallIntent {
    provider: Arc<dyn Provider>,
    /// The same, for reading the transcript ahead before the call has asked.
    before_asked: Arc<dyn Provider>,
    quotas: Arc<Quotas>,
    account: Account,
    turns: Arc<Semaphore>,
    places: Arc<ReadyPlaces>,
    ahead: Mutex<Ahead>,
    /// False once a run found the organisation's chat-token pool used up (until one does not).
    paid_up: Arc<AtomicBool>,
}

impl CallIntent {
    /// The analyses of the call `account` pays for, on `provider`, each waiting for one of
    /// `turns` while it runs; its transcript is read ahead before it asks only while it holds
    /// one of `places`.
    pub fn new(
        provider: Arc<dyn Provider>,
        quotas: Arc<Quotas>,
        account: Account,
        turns: Arc<Semaphore>,
        places: Arc<ReadyPlaces>,
    ) -> Self {
        Self {
            before_asked: for_tenant(
                provider.clone(),
                &account.org_id,
                crate::llm::fair::Class::Batch,
            ),
            provider: for_tenant(provider, &account.org_id, crate::llm::fair::Class::Live),
            quotas,
            account,
            turns,
            places,
            ahead: Mutex::new(Ahead::Without),
            paid_up: Arc::new(AtomicBool::new(true)),
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
        let paid_up = self.paid_up.clone();
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
                .ok_or_else(|| "this organisation's chat-token quota is used up".to_owned());
            // Reading ahead for a call whose organisation cannot pay for the next run would be
            // model time nobody is billed for: it stops until a run is paid for again.
            paid_up.store(reservation.is_ok(), Ordering::Relaxed);
            let reservation = reservation?;
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

    fn prefill(&self, transcript: String, asked: bool) {
        let (provider, class) = {
            let mut ahead = self.ahead.lock();
            if asked {
                // Its place, if any, goes back: live work needs none.
                *ahead = Ahead::Asked;
            }
            if !self.paid_up.load(Ordering::Relaxed) {
                return;
            }
            if let Ahead::Without = *ahead {
                if let Some(place) = self.places.take(&self.account.org_id, Instant::now()) {
                    *ahead = Ahead::Holding { _place: place };
                }
            }
            match *ahead {
                Ahead::Asked => (&self.provider, crate::llm::fair::Class::Live),
                Ahead::Holding { .. } => (&self.before_asked, crate::llm::fair::Class::Batch),
                Ahead::Without => return,
            }
        };
        provider.prefill(
            messages(
                ProfileKind::Intent,
                LIVE_LAYOUT,
                Confidence::of(self.provider.as_ref()),
                &transcript,
            ),
            Some(self.account.org_id.clone()),
            class,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::fair::Class;
    use crate::llm::{Completion, Deltas, Generation, Message};

    #[test]
    fn places_are_capped_and_come_back_when_dropped() {
        let places = ReadyPlaces::new(2);
        let now = Instant::now();
        let a = places.take("org_a", now).expect("a free place");
        let b = places
            .take("org_a", now)
            .expect("alone, it may use them all");
        assert!(places.take("org_a", now).is_none(), "two in all");
        assert_eq!(places.held(), 2);
        drop(a);
        assert_eq!(places.held(), 1);
        let _c = places.take("org_b", now).expect("the place given back");
        drop(b);
        assert!(ReadyPlaces::new(0).take("org_a", now).is_none());
    }

    #[test]
    fn an_organisation_holding_half_gets_no_more_while_another_waits() {
        let places = ReadyPlaces::new(4);
        let now = Instant::now();
        let held: Vec<ReadyPlace> = (0..4)
            .map(|_| places.take("org_a", now).expect("free places"))
            .collect();
        // Another organisation's call finds none, and is now waiting.
        assert!(places.take("org_b", now).is_none());
        let mut held = held.into_iter();
        drop(held.next());
        // The freed place is not org_a's again while org_b waits (org_a holds 3 of 4) ...
        assert!(places.take("org_a", now).is_none());
        let b = places
            .take("org_b", now)
            .expect("the waiting organisation's");
        // ... and once nobody waits, org_a may fill the places again.
        drop(held.next());
        drop(held.next());
        let a: Vec<ReadyPlace> = (0..2)
            .map(|_| places.take("org_a", now).expect("nobody waits"))
            .collect();
        assert_eq!(places.held(), 4);
        // A third organisation waits; org_a, at 2 of 4 once one of its calls ends, gets no more.
        assert!(places.take("org_c", now).is_none());
        drop(held.next());
        assert!(places.take("org_a", now).is_none(), "half of 4 is 2");
        let c = places
            .take("org_c", now)
            .expect("the waiting organisation's");
        drop((a, b, c));
    }

    #[test]
    fn an_organisation_refused_a_minute_ago_no_longer_waits() {
        let places = ReadyPlaces::new(2);
        let now = Instant::now();
        let first = places.take("org_a", now).unwrap();
        let second = places.take("org_a", now).unwrap();
        assert!(places.take("org_b", now).is_none());
        drop(second);
        assert!(places.take("org_a", now).is_none(), "org_b waits");
        let later = now + WAITING_FOR_A_PLACE + Duration::from_millis(1);
        let again = places.take("org_a", later).expect("nobody waits any more");
        drop((first, again));
    }

    /// Records what it is asked to prepare: for whom, at which class, and the prompt's end.
    #[derive(Default)]
    struct Prepares(Mutex<Vec<(Option<String>, Class, String)>>);

    #[async_trait::async_trait]
    impl Provider for Prepares {
        async fn generate(&self, _: Generation, _: Deltas) -> Result<Completion, LlmError> {
            Err(LlmError::Engine("not asked here".into()))
        }

        fn name(&self) -> &str {
            "prepares"
        }

        fn prefill(&self, messages: Vec<Message>, tenant: Option<String>, class: Class) {
            let last = messages
                .last()
                .map(|m| m.content.clone())
                .unwrap_or_default();
            self.0.lock().push((tenant, class, last));
        }
    }

    fn intent_of(
        org: &str,
        provider: Arc<Prepares>,
        places: &Arc<ReadyPlaces>,
        quotas: &Arc<Quotas>,
    ) -> CallIntent {
        CallIntent::new(
            provider,
            quotas.clone(),
            Account {
                org_id: org.into(),
                key_id: "conn".into(),
            },
            Arc::new(Semaphore::new(1)),
            places.clone(),
        )
    }

    /// Quotas over a new store in `dir`, the free plan holding `tokens` chat tokens a month.
    fn quotas_in(
        dir: &std::path::Path,
        tokens: u64,
    ) -> (Arc<Quotas>, Arc<dyn crate::store::Store>) {
        let env = [(
            "CALLSTREAM_PLANS__FREE__CHAT_TOKENS_PER_MONTH".to_owned(),
            tokens.to_string(),
        )];
        let config = Arc::new(crate::config::Config::load_with_env(None, env).unwrap());
        let store: Arc<dyn crate::store::Store> = Arc::new(
            crate::store::SledStore::open(
                dir,
                crate::store::SecretBox::new(&[7; crate::store::crypto::KEY_LEN]),
            )
            .unwrap(),
        );
        let shared: Arc<dyn crate::store::SharedState> =
            Arc::new(crate::store::shared::Local::default());
        (Arc::new(Quotas::new(config, store.clone(), shared)), store)
    }

    #[tokio::test]
    async fn a_call_whose_organisation_cannot_pay_is_not_read_ahead() {
        let dir = tempfile::tempdir().unwrap();
        // A pool smaller than one run.
        let (quotas, store) = quotas_in(dir.path(), 100);
        store
            .insert_org(&crate::store::Org {
                id: "org_a".into(),
                name: "Acme".into(),
                system_prompt: None,
                mcp: None,
                mcp_allow: Vec::new(),
                history: Default::default(),
                plan: "free".into(),
                deleted: false,
                created_at_ms: 0,
            })
            .await
            .unwrap();
        let provider = Arc::new(Prepares::default());
        let places = ReadyPlaces::new(1);
        let call = intent_of("org_a", provider.clone(), &places, &quotas);
        call.prefill("Customer: I want to cancel.\n".into(), false);
        assert_eq!(places.held(), 1);
        let refused = call
            .classify("Customer: I want to cancel.\n".into())
            .await
            .unwrap_err();
        assert!(refused.contains("quota is used up"), "{refused}");
        call.prefill("Customer: I want to cancel.\nAgent: Why?\n".into(), true);
        assert_eq!(
            provider.0.lock().len(),
            1,
            "read ahead only before the refusal"
        );
        assert_eq!(places.held(), 0, "its place went back when it asked");
    }

    #[tokio::test]
    async fn a_call_is_read_ahead_while_it_holds_a_place_and_after_it_asked() {
        let dir = tempfile::tempdir().unwrap();
        let (quotas, _) = quotas_in(dir.path(), 100_000);
        let provider = Arc::new(Prepares::default());
        let places = ReadyPlaces::new(1);
        let first = intent_of("org_a", provider.clone(), &places, &quotas);
        let second = intent_of("org_a", provider.clone(), &places, &quotas);

        first.prefill("Customer: my router keeps dropping.\n".into(), false);
        // The only place is the first call's: the second is not read ahead before it asks.
        second.prefill("Customer: I want to cancel.\n".into(), false);
        assert_eq!(places.held(), 1);
        // Once it has asked, it is read ahead as live work, without a place.
        second.prefill("Customer: I want to cancel.\nAgent: Why?\n".into(), true);
        // The first asks: its place goes back, and it is read ahead as live work too.
        first.prefill(
            "Customer: my router keeps dropping.\nAgent: Sorry.\n".into(),
            true,
        );
        assert_eq!(places.held(), 0);
        drop(first);

        let seen = provider.0.lock().clone();
        let org = Some("org_a".to_owned());
        let classes: Vec<(Option<String>, Class)> =
            seen.iter().map(|(t, c, _)| (t.clone(), *c)).collect();
        assert_eq!(
            classes,
            [
                (org.clone(), Class::Batch),
                (org.clone(), Class::Live),
                (org.clone(), Class::Live)
            ]
        );
        assert!(seen[0].2.contains("my router keeps dropping."));
        assert!(seen[1].2.contains("Agent: Why?"));
        assert!(seen[2].2.contains("Agent: Sorry."));
    }
}
