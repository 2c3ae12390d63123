//! `POST /api/transcribe`: an audio file in; the transcript, timed segments per channel, the
//! customer's intent and, on request, BANT and NEAT-P records out, billed in audio-minutes.
//!
//! Form fields (`multipart/form-data`): `file` (required; WAV, FLAC, MP3, Ogg Vorbis, Ogg Opus),
//! `language` (default `en`; must be listed by `GET /api/languages`), `extract_bant` and
//! `extract_neat` (`true` or `false`, default `false`), `user` (optional end-user id recorded
//! with the usage). Unknown fields are ignored.
//!
//! Order of refusal, cheapest first: key (401/404), RPM (429), exhausted audio quota (402),
//! declared body over `[transcribe] max_upload_mb` (413, before the body is read), form errors
//! (400), unsupported format (415), damaged or empty audio (400), a file longer than the quota
//! that remains (402). Nothing is billed unless the whole request succeeds.

use std::time::Instant;

use bytes::BufMut;
use futures_util::TryStreamExt;
use serde::Serialize;
use serde_json::Value;
use warp::{Filter, Rejection, Reply};

use callstream_actors::asr::file::{transcribe_channels, FileSegment};
use callstream_actors::asr::Word;
use callstream_actors::audio::decode::{decode, DecodeError, OUTPUT_RATE};
use callstream_actors::usage::{Allowance, UsageKind, UsageSource};

use crate::app::App;
use crate::auth::{AuthError, Caller};
use crate::http::errors::ApiError;
use crate::llm::profiles::{analyse, ProfileKind};

/// The form, checked.
#[derive(Debug)]
struct Form {
    file: Vec<u8>,
    extension: Option<String>,
    language: String,
    bant: bool,
    neat: bool,
    user: Option<String>,
}

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::BadRequest {
        code,
        message: message.into(),
    }
}

fn flag(name: &str, value: &str) -> Result<bool, ApiError> {
    match value.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(bad(
            "invalid_flag",
            format!("{name} must be true or false, not {other:?}"),
        )),
    }
}

async fn read_form(app: &App, form: warp::multipart::FormData) -> Result<Form, ApiError> {
    let parts: Vec<(String, Option<String>, Vec<u8>)> = form
        .and_then(|part| async move {
            let name = part.name().to_owned();
            let filename = part.filename().map(str::to_owned);
            let data = part
                .stream()
                .try_fold(Vec::new(), |mut acc, buf| async move {
                    acc.put(buf);
                    Ok(acc)
                })
                .await?;
            Ok((name, filename, data))
        })
        .try_collect()
        .await
        .map_err(|e| {
            bad(
                "invalid_form",
                format!("the multipart body is malformed: {e}"),
            )
        })?;
    let mut file = None;
    let mut language = None;
    let (mut bant, mut neat, mut user) = (false, false, None);
    for (name, filename, data) in parts {
        let text = || {
            String::from_utf8(data.clone())
                .map_err(|_| bad("invalid_form", format!("{name} must be text")))
        };
        match name.as_str() {
            "file" => {
                let extension = filename
                    .as_deref()
                    .and_then(|f| f.rsplit_once('.'))
                    .map(|(_, ext)| ext.to_ascii_lowercase());
                file = Some((data, extension));
            }
            "language" => language = Some(text()?.trim().to_owned()),
            "extract_bant" => bant = flag("extract_bant", &text()?)?,
            "extract_neat" => neat = flag("extract_neat", &text()?)?,
            "user" => user = Some(text()?).filter(|u| !u.is_empty() && u.chars().count() <= 256),
            _ => {}
        }
    }
    let (file, extension) =
        file.ok_or_else(|| bad("missing_file", "the form has no file field"))?;
    let language = language
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "en".to_owned());
    if !app.languages.iter().any(|l| l.code == language) {
        let known: Vec<&str> = app.languages.iter().map(|l| l.code.as_str()).collect();
        return Err(bad(
            "invalid_language",
            format!(
                "language {language:?} is not supported; GET /api/languages lists {}",
                known.join(", ")
            ),
        ));
    }
    Ok(Form {
        file,
        extension,
        language,
        bant,
        neat,
        user,
    })
}

/// One segment of the response.
#[derive(Debug, Serialize)]
struct Segment {
    id: usize,
    start: f64,
    end: f64,
    text: String,
    channel: usize,
    speaker: String,
    confidence: f32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    words: Vec<Word>,
}

#[derive(Debug, Serialize)]
struct Response {
    text: String,
    language: String,
    duration: f64,
    channels: usize,
    segments: Vec<Segment>,
    intent: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    bant: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    neat_p: Option<Value>,
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `POST /api/transcribe`.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let limit = app.config.transcribe.max_upload_bytes();
    warp::path!("api" / "transcribe")
        .and(warp::post())
        .and(crate::http::filters::billed(
            app.clone(),
            UsageKind::AudioMs,
        ))
        .and(warp::body::content_length_limit(limit))
        .and(warp::multipart::form().max_length(limit))
        .and_then(move |caller: Caller, form: warp::multipart::FormData| {
            let app = app.clone();
            async move {
                transcribe(app, caller, form)
                    .await
                    .map_err(warp::reject::custom)
            }
        })
}

async fn transcribe(
    app: App,
    caller: Caller,
    form: warp::multipart::FormData,
) -> Result<warp::reply::Response, ApiError> {
    let Form {
        file,
        extension,
        language,
        bant,
        neat,
        user,
    } = read_form(&app, form).await?;
    let audio =
        tokio::task::spawn_blocking(move || decode(file, extension.as_deref(), OUTPUT_RATE))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| match e {
                DecodeError::Unsupported(m) => ApiError::UnsupportedMedia(m),
                other => bad("invalid_audio", other.to_string()),
            })?;
    let duration_ms = (audio.duration_secs() * 1000.0).round() as u64;
    if duration_ms == 0 {
        return Err(bad("invalid_audio", "the file holds no audio"));
    }
    // A file longer than what is left of the quota is refused whole: it would be transcribed
    // and then not billable.
    match app
        .auth
        .allowance(&caller, UsageKind::AudioMs, crate::clock::now_ms())
    {
        Ok(Allowance::Remaining(left)) if left < duration_ms => {
            return Err(
                ApiError::Auth(AuthError::QuotaExhausted(UsageKind::AudioMs)).with_detail(format!(
                    "the file is {:.2} audio-minutes; {:.2} remain this month",
                    duration_ms as f64 / 60_000.0,
                    left as f64 / 60_000.0
                )),
            );
        }
        Ok(_) => {}
        Err(e) => return Err(ApiError::Auth(e)),
    }

    let started = Instant::now();
    let channels = audio.channels.len();
    let (pool, vad, lang) = (app.asr.clone(), app.config.vad.config(), language.clone());
    let segments = tokio::task::spawn_blocking(move || {
        transcribe_channels(&pool, &audio.channels, &lang, vad, &mut |_, _| {})
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
    .map_err(|e| ApiError::Internal(format!("speech engine: {e}")))?;
    let transcribed = started.elapsed();

    let role = |c: usize| {
        if channels > 1 {
            app.config.transcribe.role(c)
        } else {
            "speaker".to_owned()
        }
    };
    let dialogue: String = segments
        .iter()
        .map(|s| {
            let mut who = role(s.channel);
            if let Some(first) = who.get_mut(..1) {
                first.make_ascii_uppercase();
            }
            format!("{who}: {}\n", s.text)
        })
        .collect();
    let started_analysis = Instant::now();
    let provider = app.llm.clone();
    let transcript = if dialogue.is_empty() {
        "(no speech)".to_owned()
    } else {
        dialogue
    };
    let run = |kind| analyse(provider.as_ref(), kind, &transcript);
    let intent = run(ProfileKind::Intent).await?.0;
    let bant = if bant {
        Some(run(ProfileKind::Bant).await?.0)
    } else {
        None
    };
    let neat_p = if neat {
        Some(run(ProfileKind::NeatP).await?.0)
    } else {
        None
    };
    tracing::info!(
        audio_s = duration_ms as f64 / 1000.0,
        channels,
        transcription_s = transcribed.as_secs_f64(),
        analysis_s = started_analysis.elapsed().as_secs_f64(),
        "file transcribed"
    );

    crate::usage::record(
        app.store.clone(),
        &caller,
        UsageKind::AudioMs,
        duration_ms,
        UsageSource::Transcribe,
        user,
    )
    .await
    .map_err(|e| ApiError::Billing(e.to_string()))?;

    let text = segments
        .iter()
        .map(|s| s.text.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let segments = segments
        .into_iter()
        .enumerate()
        .map(|(id, s): (usize, FileSegment)| Segment {
            id,
            start: round3(s.start),
            end: round3(s.end),
            speaker: role(s.channel),
            channel: s.channel,
            confidence: (s.confidence * 1000.0).round() / 1000.0,
            words: s.words,
            text: s.text,
        })
        .collect();
    let response = Response {
        text,
        language,
        duration: duration_ms as f64 / 1000.0,
        channels,
        segments,
        intent,
        bant,
        neat_p,
    };
    Ok(warp::reply::json(&response).into_response())
}
