//! `POST /api/transcribe`: an audio file in; the transcript, timed segments per channel, the
//! customer's intent and, on request, BANT and NEAT-P records out, billed in audio-minutes. The
//! work is [`crate::files::transcribe`]; this route reads the form and answers with JSON.
//!
//! Form fields (`multipart/form-data`): `file` (required; WAV, FLAC, MP3, Ogg Vorbis, Ogg Opus),
//! `language` (default `en`; must be listed by `GET /api/languages`), `extract_bant` and
//! `extract_neat` (`true`/`false` in any case, or `1`/`0`; default `false`), `user` (optional
//! end-user id recorded with the usage). Unknown fields are ignored.
//!
//! Order of refusal, cheapest first: key (401/404), RPM (429), exhausted audio quota (402),
//! declared body over `[transcribe] max_upload_mb` (413, before the body is read; a chunked
//! body without a length is counted as it is read and refused at the same size), form errors
//! (400), unsupported language (400), unsupported format (415), damaged or empty audio (400), a
//! file longer than the quota that remains (402). Nothing is billed unless the whole request
//! succeeds.

use bytes::Buf;
use futures_util::TryStreamExt;
use warp::{Filter, Rejection, Reply};

use callstream_actors::usage::UsageKind;

use crate::app::App;
use crate::auth::Caller;
use crate::files::{Analyses, FileRequest, Payer};
use crate::http::errors::ApiError;

/// The form, checked.
#[derive(Debug)]
struct Form {
    file: Vec<u8>,
    file_name: Option<String>,
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
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(bad(
            "invalid_flag",
            format!(
                "{name} must be true or false (or 1 or 0), not {:?}",
                value.trim()
            ),
        )),
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::TooLarge {
        code: "payload_too_large",
        message: format!("the upload is larger than the {} MiB accepted", limit >> 20),
    }
}

/// Refuses a body that declares more than `limit` bytes, before it is read. A body without a
/// length (chunked) passes, and is counted as it is read.
fn declared_within(limit: u64) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and_then(move |length: Option<u64>| async move {
            match length {
                Some(n) if n > limit => Err(warp::reject::custom(too_large(limit))),
                _ => Ok(()),
            }
        })
        .untuple_one()
}

/// Most parts a form may have.
const MAX_PARTS: usize = 16;
/// Largest text field (language, flags, user), bytes.
const MAX_FIELD: usize = 1024;

/// One part of the multipart body: name, file name, data.
type Part = (String, Option<String>, Vec<u8>);

async fn read_form(mut form: warp::multipart::FormData, max_bytes: u64) -> Result<Form, ApiError> {
    let malformed = |e: warp::Error| {
        bad(
            "invalid_form",
            format!("the multipart body is malformed: {e}"),
        )
    };
    let mut parts: Vec<Part> = Vec::new();
    // What was read in all: a body without a length is refused once past the limit.
    let mut read = 0u64;
    // A form past the limits is read to its end (it is within the upload limit) but not kept,
    // so the client, still sending, gets the answer instead of a broken connection.
    let mut refused = None;
    while let Some(part) = form.try_next().await.map_err(malformed)? {
        if refused.is_none() && parts.len() == MAX_PARTS {
            refused = Some(bad(
                "invalid_form",
                format!("the form has more than {MAX_PARTS} parts"),
            ));
        }
        let name = part.name().to_owned();
        let filename = part.filename().map(str::to_owned);
        let limit = if name == "file" {
            usize::MAX
        } else {
            MAX_FIELD
        };
        let mut data = Vec::new();
        let mut stream = part.stream();
        while let Some(mut buf) = stream.try_next().await.map_err(malformed)? {
            read += buf.remaining() as u64;
            if read > max_bytes {
                return Err(too_large(max_bytes));
            }
            if refused.is_some() {
                continue;
            }
            if data.len() + buf.remaining() > limit {
                refused = Some(bad(
                    "invalid_form",
                    format!("the form field {name:?} is longer than {MAX_FIELD} bytes"),
                ));
                continue;
            }
            while buf.has_remaining() {
                let chunk = buf.chunk();
                data.extend_from_slice(chunk);
                let n = chunk.len();
                buf.advance(n);
            }
        }
        if refused.is_none() {
            parts.push((name, filename, data));
        }
    }
    match refused {
        Some(e) => Err(e),
        None => form_of(parts),
    }
}

/// The form in `parts`, checked.
fn form_of(parts: Vec<Part>) -> Result<Form, ApiError> {
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
                file = Some((data, extension, filename.clone()));
            }
            "language" => language = Some(text()?.trim().to_owned()),
            "extract_bant" => bant = flag("extract_bant", &text()?)?,
            "extract_neat" => neat = flag("extract_neat", &text()?)?,
            "user" => user = Some(text()?).filter(|u| !u.is_empty() && u.chars().count() <= 256),
            _ => {}
        }
    }
    let (file, extension, file_name) =
        file.ok_or_else(|| bad("missing_file", "the form has no file field"))?;
    let language = language
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "en".to_owned());
    Ok(Form {
        file,
        file_name,
        extension,
        language,
        bant,
        neat,
        user,
    })
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
        .and(declared_within(limit))
        .and(warp::multipart::form().max_length(None))
        .and_then(move |caller: Caller, form: warp::multipart::FormData| {
            let app = app.clone();
            async move {
                transcribe(app, caller, form, limit)
                    .await
                    .map_err(warp::reject::custom)
            }
        })
}

async fn transcribe(
    app: App,
    caller: Caller,
    form: warp::multipart::FormData,
    limit: u64,
) -> Result<warp::reply::Response, ApiError> {
    // A place under the organisation's cap of files in progress (over every instance), taken
    // before the body is read: an upload is work too.
    let cap = caller.plan.max_file_transcriptions;
    let _place = app
        .slots
        .try_acquire(&format!("files:org:{}", caller.org.id), cap)
        .await
        .map_err(|e| ApiError::Auth(crate::auth::AuthError::Store(e)))?
        .ok_or_else(|| ApiError::TooMany {
            code: "too_many_transcriptions",
            message: format!("this organisation already has {cap} file transcriptions in progress"),
        })?;
    let Form {
        file,
        file_name,
        extension,
        language,
        bant,
        neat,
        user,
    } = read_form(form, limit).await?;
    let started_ms = crate::clock::now_ms();
    let request = FileRequest {
        bytes: file,
        extension,
        language,
        analyses: Analyses {
            intent: true,
            bant,
            neat_p: neat,
        },
        redact: caller.org.history.redacts(&caller.key.id),
    };
    let payer = Payer {
        auth: app.auth.clone(),
        caller,
        end_user: user,
    };
    let mut transcript =
        crate::files::transcribe(&app.files(), request, Some(&payer), None).await?;
    let record = crate::http::history::file_record(
        &payer.caller.org.id,
        &payer.caller.key.id,
        started_ms,
        file_name.as_deref(),
        &transcript,
    );
    // Billed and answered whatever happens here: a store that cannot keep the record costs the
    // client its id, not its transcript.
    match app.store.put_record(&record).await {
        Ok(()) => transcript.id = Some(record.head.id),
        Err(e) => tracing::error!(error = %e, "call history: a file transcription was not stored"),
    }
    Ok(warp::reply::json(&transcript).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn part(name: &str, data: &[u8]) -> Part {
        (name.to_owned(), None, data.to_vec())
    }

    #[test]
    fn fields_are_read_and_checked() {
        let form = form_of(vec![
            ("file".into(), Some("call.WAV".into()), vec![1, 2, 3]),
            part("language", b" en "),
            part("extract_bant", b"true"),
            part("unknown", b"ignored"),
        ])
        .unwrap();
        assert_eq!(form.extension.as_deref(), Some("wav"));
        assert_eq!(form.language, "en");
        assert!(form.bant && !form.neat);
        for (value, expected) in [
            ("True", true),
            ("FALSE", false),
            ("1", true),
            (" 0 ", false),
        ] {
            let form = form_of(vec![
                part("file", b"x"),
                part("extract_neat", value.as_bytes()),
            ]);
            assert_eq!(form.unwrap().neat, expected, "{value}");
        }
        let bad_flag = form_of(vec![
            part("file", b"x"),
            part("extract_neat", b"yes please"),
        ]);
        assert_eq!(bad_flag.unwrap_err().status().1, "invalid_flag");
        let missing = form_of(vec![part("language", b"en")]).unwrap_err();
        assert_eq!(missing.status().1, "missing_file");
        let not_text = form_of(vec![part("file", b"x"), part("language", &[0xff, 0xfe])]);
        assert_eq!(not_text.unwrap_err().status().1, "invalid_form");
    }

    proptest! {
        /// Whatever the parts, the form is read or refused with a 400, never a panic.
        #[test]
        fn any_parts_are_read_or_refused(
            parts in proptest::collection::vec(
                (
                    prop_oneof![
                        Just("file".to_owned()),
                        Just("language".to_owned()),
                        Just("extract_bant".to_owned()),
                        Just("extract_neat".to_owned()),
                        Just("user".to_owned()),
                        ".{0,12}",
                    ],
                    proptest::option::of(".{0,20}"),
                    proptest::collection::vec(any::<u8>(), 0..64),
                ),
                0..20,
            )
        ) {
            match form_of(parts) {
                Ok(form) => prop_assert!(!form.language.is_empty()),
                Err(e) => prop_assert_eq!(e.status().0.as_u16(), 400),
            }
        }
    }
}
