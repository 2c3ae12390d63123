//! callstream: a contact-center service. Chat completions (REST and realtime), file
//! transcription with intent and sales-qualification analysis, and live call transcription
//! over Genesys AudioHook v2, all authenticated by organisation API keys and metered.
//!
//! This crate is the service edge and its adapters; the real-time media engine is the
//! `callstream-actors` crate.

pub mod admin;
pub mod app;
pub mod auth;
pub mod body_pace;
pub mod call_intent;
pub mod callclient;
pub mod calls;
pub mod capacity;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod files;
pub mod history;
pub mod http;
pub mod lifecycle;
pub mod live;
pub mod llm;
pub mod netaddr;
pub mod peer;
pub mod ratelimit;
pub mod recorder;
pub mod server;
pub mod speech;
pub mod store;
pub mod usage;
