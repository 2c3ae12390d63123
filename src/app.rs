//! The service's shared state, built once at start and cloned into every route.

use std::sync::Arc;

use callstream_actors::asr::{model_languages, Language, ModelError};

use crate::admin::Admin;
use crate::auth::Authenticator;
use crate::config::Config;
use crate::llm::chat::{ChatService, ChatSettings};
use crate::llm::{LlmError, Provider};
use crate::store::Store;

/// Everything a request handler may need.
#[derive(Clone)]
pub struct App {
    /// The configuration it was built from.
    pub config: Arc<Config>,
    /// Persistent state.
    pub store: Arc<dyn Store>,
    /// Keys, rate limits, quotas.
    pub auth: Arc<Authenticator>,
    /// Languages of the loaded speech model.
    pub languages: Arc<Vec<Language>>,
    /// Administrative operations.
    pub admin: Admin,
    /// The language model.
    pub llm: Arc<dyn Provider>,
    /// Chat turns over the language model.
    pub chat: ChatService,
    /// The speech-recognition workers.
    pub asr: Arc<callstream_actors::asr::pool::AsrPool>,
    /// Live calls: connector authentication, billing, intent analysis.
    pub calls: Arc<crate::calls::Calls>,
    /// How many more live calls this instance takes (admission control).
    pub capacity: Arc<crate::capacity::LiveCapacity>,
    /// Caps on sessions and calls held open at once per key, connector and organisation.
    pub slots: Arc<crate::auth::slots::Slots>,
    /// State shared with the other instances on the same database.
    pub shared: Arc<dyn crate::store::SharedState>,
    /// Dashboard sign-in sessions.
    pub sessions: Arc<crate::auth::sessions::Sessions>,
    /// What guards the dashboard's sign-in form.
    pub sign_in: Arc<crate::auth::sessions::SignIn>,
    /// Trusted proxies, client addresses and their connections.
    pub peers: Arc<crate::peer::Peers>,
    /// Whether the process is stopping, and the work it waits for before it exits.
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
    /// The queue to the call history's writer.
    pub history: crate::recorder::Writer,
    /// What a live call reports to: the call history, then the live page.
    pub recorder: Arc<dyn callstream_actors::call::CallObserver>,
}

/// Why the service could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A setting is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] crate::store::OpenError),
    /// The speech model is missing or unreadable.
    #[error("speech model: {0} (scripts/setup.sh installs it)")]
    Model(#[from] ModelError),
    /// The language model could not be loaded or reached.
    #[error("language model: {0} (scripts/setup.sh installs the embedded one)")]
    Llm(#[from] LlmError),
    /// The speech engine could not start.
    #[error("speech engine: {0}")]
    Asr(#[from] callstream_actors::asr::AsrError),
}

impl App {
    /// What file transcription runs on.
    pub fn files(&self) -> crate::files::FileEngines {
        crate::files::FileEngines {
            pool: self.asr.clone(),
            languages: self.languages.clone(),
            vad: self.config.vad.config(),
            packing: self.config.transcribe.packing(),
            channel_roles: self.config.transcribe.channel_roles.clone(),
            max_duration_s: self.config.transcribe.max_duration_s,
            llm: Some(self.llm.clone()),
        }
    }

    /// The service on the engines `config` names: [`App::builder`] with nothing injected.
    pub async fn open(config: Config) -> Result<Self, OpenError> {
        Self::builder(config).open().await
    }

    /// Puts the service together; the speech engine and the language model default to the
    /// ones `config` names, and may be given instead (tests give in-memory ones).
    pub fn builder(config: Config) -> AppBuilder {
        AppBuilder {
            config,
            speech: None,
            llm: None,
        }
    }
}

/// Puts an [`App`] together: see [`App::builder`].
pub struct AppBuilder {
    config: Config,
    speech: Option<(callstream_actors::asr::pool::AsrPool, Vec<Language>)>,
    llm: Option<Arc<dyn Provider>>,
}

impl AppBuilder {
    /// Transcribes with `pool` (its workers' engine), offering `languages`, instead of the
    /// Whisper model of `models.whisper`.
    pub fn speech(
        mut self,
        pool: callstream_actors::asr::pool::AsrPool,
        languages: Vec<Language>,
    ) -> Self {
        self.speech = Some((pool, languages));
        self
    }

    /// Chats and analyses with `provider` instead of the model `llm.provider` names.
    pub fn llm(mut self, provider: Arc<dyn Provider>) -> Self {
        self.llm = Some(provider);
        self
    }

    /// Opens the store (announcing this instance to the others on it), starts what was not
    /// given, and puts the service together.
    pub async fn open(self) -> Result<App, OpenError> {
        let config = Arc::new(self.config);
        // What is quick to check first: the speech model is there, the store opens.
        let languages = match &self.speech {
            Some((_, given)) => given.clone(),
            None => model_languages(&config.models.whisper)?,
        };
        let opened = crate::store::open(&config.storage).await?;
        let llm = match self.llm {
            Some(given) => given,
            None => crate::llm::build_provider(&config)?,
        };
        let asr = Arc::new(match self.speech {
            Some((given, _)) => given,
            None => crate::speech::start_pool(&config, None)?,
        });
        opened.shared.start_instance().await;
        let store = opened.store.clone();
        let chat = ChatService::new(
            llm.clone(),
            ChatSettings {
                max_tool_iterations: config.llm.max_tool_iterations,
                mcp_timeout: std::time::Duration::from_millis(config.llm.mcp_timeout_ms),
                mcp_policy: crate::llm::mcp::McpPolicy::new(
                    &config.llm.mcp_allow,
                    &config.llm.mcp_ports,
                )
                .map_err(OpenError::Config)?,
            },
        );
        let quotas =
            crate::usage::Quotas::new(config.clone(), store.clone(), opened.shared.clone());
        let calls = Arc::new(crate::calls::Calls::new(
            config.clone(),
            store.clone(),
            llm.clone(),
            quotas.clone(),
            opened.shared.clone(),
        ));
        let history = crate::recorder::Writer::spawn(store.clone());
        let recorder = Arc::new(crate::recorder::Recorder::new(
            history.clone(),
            Some(calls.live.clone()),
        ));
        crate::recorder::spawn_purge(
            store.clone(),
            config.plans.clone(),
            std::time::Duration::from_secs(config.storage.history_purge_every_s.max(1)),
        );
        Ok(App {
            history,
            recorder,
            lifecycle: Arc::default(),
            capacity: Arc::new(crate::capacity::LiveCapacity::new(
                crate::capacity::Limits {
                    most: config.calls.max_calls_per_instance,
                    unmeasured: config.calls.admit_unmeasured_calls,
                    max_load: config.calls.admit_max_load,
                },
                std::time::Duration::from_millis(config.calls.admit_max_wait_ms),
            )),
            slots: Arc::new(crate::auth::slots::Slots::new(opened.shared.clone())),
            sessions: Arc::new(crate::auth::sessions::Sessions::new(opened.shared.clone())),
            sign_in: Arc::new(crate::auth::sessions::SignIn::new(
                &config.dashboard,
                opened.shared.clone(),
                opened.form_key,
            )),
            peers: Arc::new(crate::peer::Peers::new(
                crate::netaddr::Network::parse_all(&config.server.trusted_proxies)
                    .map_err(OpenError::Config)?,
                config.server.max_connections_per_address,
            )),
            calls,
            asr,
            llm,
            chat,
            auth: Arc::new(Authenticator::new(
                config.clone(),
                store.clone(),
                quotas,
                opened.shared.clone(),
            )),
            admin: Admin::new(config.clone(), store.clone(), opened.shared.clone()),
            shared: opened.shared.clone(),
            languages: Arc::new(languages),
            store,
            config,
        })
    }
}
