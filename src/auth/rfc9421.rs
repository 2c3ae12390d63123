//! HTTP Message Signatures (RFC 9421) with HMAC-SHA256, as AudioHook signs its WebSocket
//! upgrade requests: verification for the server, signing for the call client. Sans-IO: the
//! request's parts, the clock and the nonce come in as arguments.
//!
//! Verification, in order: both headers parse (RFC 8941 dictionaries); the label signs the
//! components the policy requires; `alg` is absent or `hmac-sha256`; `keyid` is the key the
//! caller presented; the nonce is long enough; `created` is no more than the allowed skew in
//! the future and no older than the maximum age; `expires`, if present, has not passed; the
//! HMAC over the signature base matches (compared in constant time); and the `(keyid, nonce)`
//! pair has not been seen within the window ([`NonceCache`]).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

use crate::store::{SharedState, Space, StoreError};

/// The parts of a request that signatures cover.
#[derive(Debug, Clone)]
pub struct RequestParts<'a> {
    /// `GET`, `POST`...
    pub method: &'a str,
    /// Path and query as on the request line.
    pub target: &'a str,
    /// The `Host` header (with its port, if it has one).
    pub authority: &'a str,
    /// Header fields; names in any case.
    pub headers: &'a [(String, String)],
}

/// What a signature must satisfy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Components that must be covered (lower-case).
    pub required: Vec<String>,
    /// Longest accepted age of `created`, seconds (`None`: no age check).
    pub max_age_s: Option<i64>,
    /// Allowed clock skew, seconds.
    pub skew_s: i64,
    /// Shortest accepted nonce (`None`: no nonce required).
    pub min_nonce: Option<usize>,
}

impl Policy {
    /// AudioHook's: the six components Genesys signs, 10 s maximum age, 3 s skew, nonce of at
    /// least 22 characters.
    pub fn audiohook() -> Self {
        Self {
            required: [
                "@request-target",
                "@authority",
                "audiohook-organization-id",
                "audiohook-session-id",
                "audiohook-correlation-id",
                "x-api-key",
            ]
            .map(str::to_owned)
            .to_vec(),
            max_age_s: Some(10),
            skew_s: 3,
            min_nonce: Some(22),
        }
    }
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing.
    #[error("missing {0} header")]
    Missing(&'static str),
    /// A header does not parse.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// A required component is not covered, or a covered one is absent from the request.
    #[error("component {0} is not covered or not present")]
    Component(String),
    /// Not HMAC-SHA256.
    #[error("unsupported algorithm")]
    Algorithm,
    /// `keyid` is not the presented key.
    #[error("keyid does not match the key")]
    KeyId,
    /// The nonce is missing or too short.
    #[error("nonce missing or too short")]
    Nonce,
    /// `created` is missing, in the future, or too old; or `expires` has passed.
    #[error("signature is not valid at this time")]
    Time,
    /// The HMAC does not match.
    #[error("signature does not verify")]
    Mismatch,
    /// This (keyid, nonce) was already used.
    #[error("nonce already used")]
    Replay,
}

/// A parsed `Signature-Input` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureInput {
    /// The label (`sig1`).
    pub label: String,
    /// Covered component identifiers, in order.
    pub components: Vec<String>,
    /// The member's value exactly as sent (the `@signature-params` line).
    pub raw: String,
    /// Parameters: strings unquoted, integers as text.
    pub params: HashMap<String, String>,
}

/// Splits an RFC 8941 dictionary into `(key, raw value)` at top-level commas.
fn dictionary(value: &str) -> Vec<(String, String)> {
    let mut members = Vec::new();
    let (mut depth, mut quoted, mut start) = (0i32, false, 0usize);
    let bytes = value.as_bytes();
    for i in 0..=bytes.len() {
        let c = bytes.get(i).copied();
        match c {
            Some(b'"') if i == 0 || bytes[i - 1] != b'\\' => quoted = !quoted,
            Some(b'(') if !quoted => depth += 1,
            Some(b')') if !quoted => depth -= 1,
            Some(b',') | None if !quoted && depth == 0 => {
                let member = value[start..i].trim();
                if let Some((k, v)) = member.split_once('=') {
                    members.push((k.trim().to_owned(), v.trim().to_owned()));
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    members
}

/// Parses the `Signature-Input` member with `label`, or the first one.
pub fn parse_input(header: &str, label: Option<&str>) -> Result<SignatureInput, SignatureError> {
    let bad = || SignatureError::Malformed("Signature-Input");
    let (label, raw) = dictionary(header)
        .into_iter()
        .find(|(k, _)| label.is_none_or(|l| l == k))
        .ok_or_else(bad)?;
    let inner_end = raw.find(')').ok_or_else(bad)?;
    let inner = raw.strip_prefix('(').ok_or_else(bad)?;
    let list = &inner[..inner_end - 1];
    let components = list
        .split_whitespace()
        .map(|c| {
            c.strip_prefix('"')
                .and_then(|c| c.strip_suffix('"'))
                .map(str::to_lowercase)
                .ok_or_else(bad)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut params = HashMap::new();
    for p in raw[inner_end + 1..]
        .split(';')
        .filter(|p| !p.trim().is_empty())
    {
        let (k, v) = p.split_once('=').ok_or_else(bad)?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        params.insert(k.trim().to_owned(), v.to_owned());
    }
    Ok(SignatureInput {
        label,
        components,
        raw,
        params,
    })
}

/// The signature bytes for `label` from a `Signature` header.
pub fn parse_signature(header: &str, label: &str) -> Result<Vec<u8>, SignatureError> {
    let bad = || SignatureError::Malformed("Signature");
    let (_, value) = dictionary(header)
        .into_iter()
        .find(|(k, _)| k == label)
        .ok_or_else(bad)?;
    let b64 = value
        .strip_prefix(':')
        .and_then(|v| v.strip_suffix(':'))
        .ok_or_else(bad)?;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| bad())
}

/// The signature base (RFC 9421 section 2.5) of `request` for `input`.
pub fn signature_base(
    request: &RequestParts<'_>,
    input: &SignatureInput,
) -> Result<String, SignatureError> {
    let mut lines = Vec::with_capacity(input.components.len() + 1);
    for c in &input.components {
        let value = match c.as_str() {
            "@request-target" => request.target.to_owned(),
            "@authority" => request.authority.to_lowercase(),
            "@method" => request.method.to_uppercase(),
            "@path" => request.target.split('?').next().unwrap_or("").to_owned(),
            "@query" => format!("?{}", request.target.split_once('?').map_or("", |(_, q)| q)),
            name if !name.starts_with('@') => {
                let values: Vec<&str> = request
                    .headers
                    .iter()
                    .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim())
                    .collect();
                if values.is_empty() {
                    return Err(SignatureError::Component(name.to_owned()));
                }
                values.join(", ")
            }
            other => return Err(SignatureError::Component(other.to_owned())),
        };
        lines.push(format!("\"{c}\": {value}"));
    }
    lines.push(format!("\"@signature-params\": {}", input.raw));
    Ok(lines.join("\n"))
}

/// The facts of a verified signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `keyid`.
    pub keyid: Option<String>,
    /// `nonce`.
    pub nonce: Option<String>,
    /// `created`.
    pub created: Option<i64>,
}

/// Verifies the signature of `request` made with `key`, for a caller that presented `keyid`
/// (`None` skips the keyid check), at Unix time `now`.
pub fn verify(
    request: &RequestParts<'_>,
    signature_input: &str,
    signature: &str,
    key: &[u8],
    keyid: Option<&str>,
    now: i64,
    policy: &Policy,
) -> Result<Verified, SignatureError> {
    let input = parse_input(signature_input, None)?;
    for required in &policy.required {
        if !input.components.contains(required) {
            return Err(SignatureError::Component(required.clone()));
        }
    }
    if input.params.get("alg").is_some_and(|a| a != "hmac-sha256") {
        return Err(SignatureError::Algorithm);
    }
    if let Some(expected) = keyid {
        if input.params.get("keyid").map(String::as_str) != Some(expected) {
            return Err(SignatureError::KeyId);
        }
    }
    let nonce = input.params.get("nonce").cloned();
    if let Some(min) = policy.min_nonce {
        if nonce.as_ref().is_none_or(|n| n.chars().count() < min) {
            return Err(SignatureError::Nonce);
        }
    }
    let int = |k: &str| {
        input.params.get(k).map(|v| {
            v.parse::<i64>()
                .map_err(|_| SignatureError::Malformed("Signature-Input"))
        })
    };
    let created = int("created").transpose()?;
    let expires = int("expires").transpose()?;
    if let Some(max_age) = policy.max_age_s {
        let created = created.ok_or(SignatureError::Time)?;
        // Saturating: the numbers come from the client and may be anything an i64 holds.
        if created > now.saturating_add(policy.skew_s)
            || created
                .saturating_add(max_age)
                .saturating_add(policy.skew_s)
                < now
        {
            return Err(SignatureError::Time);
        }
        if expires.is_some_and(|e| e.saturating_add(policy.skew_s) < now) {
            return Err(SignatureError::Time);
        }
    }
    let base = signature_base(request, &input)?;
    let given = parse_signature(signature, &input.label)?;
    mac(key, &base)
        .verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)?;
    Ok(Verified {
        keyid: input.params.get("keyid").cloned(),
        nonce,
        created,
    })
}

fn mac(key: &[u8], base: &str) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(base.as_bytes());
    mac
}

/// What a signer puts in the signature parameters.
#[derive(Debug, Clone)]
pub struct SignParams<'a> {
    /// The key id (the connector's client id).
    pub keyid: &'a str,
    /// A fresh random nonce.
    pub nonce: &'a str,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds.
    pub expires: i64,
}

/// Signs `request` as Genesys AudioHook does: the components of [`Policy::audiohook`], label
/// `sig1`, parameters `keyid`, `nonce`, `alg`, `created`, `expires` in that order,
/// HMAC-SHA256 keyed by `key`. Returns the `Signature-Input` and `Signature` header values.
pub fn sign(
    request: &RequestParts<'_>,
    params: &SignParams<'_>,
    key: &[u8],
) -> Result<(String, String), SignatureError> {
    let components = Policy::audiohook()
        .required
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(" ");
    let input_header = format!(
        "sig1=({components});keyid=\"{}\";nonce=\"{}\";alg=\"hmac-sha256\";created={};expires={}",
        params.keyid, params.nonce, params.created, params.expires
    );
    let input = parse_input(&input_header, Some("sig1"))?;
    let base = signature_base(request, &input)?;
    let signature =
        base64::engine::general_purpose::STANDARD.encode(mac(key, &base).finalize().into_bytes());
    Ok((input_header, format!("sig1=:{signature}:")))
}

/// Signs an AudioHook upgrade request with a connector's base64 client secret, a random nonce
/// and a 30 s validity from `created`.
pub fn sign_audiohook(
    request: &RequestParts<'_>,
    client_id: &str,
    client_secret_b64: &str,
    created: i64,
) -> Result<(String, String), String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(client_secret_b64.trim())
        .map_err(|e| format!("the client secret is not base64: {e}"))?;
    let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 18]>());
    let params = SignParams {
        keyid: client_id,
        nonce: &nonce,
        created,
        expires: created + 30,
    };
    sign(request, &params, &key).map_err(|e| e.to_string())
}

/// Nonces of accepted signatures, per `keyid`, kept until the signature could no longer be
/// accepted anyway. The entries live in [`SharedState`], so with a shared database a nonce
/// accepted by one instance is refused by every other.
pub struct NonceCache {
    shared: Arc<dyn SharedState>,
}

impl NonceCache {
    /// A cache over `shared`.
    pub fn new(shared: Arc<dyn SharedState>) -> Self {
        Self { shared }
    }

    /// Records the pair until `until` (Unix seconds): `Ok(false)` if it is already recorded.
    /// The pair is kept as a SHA-256, so a long nonce costs no more than a short one.
    pub async fn check_and_insert(
        &self,
        keyid: &str,
        nonce: &str,
        until: i64,
    ) -> Result<bool, StoreError> {
        let mut h = Sha256::new();
        h.update(keyid.as_bytes());
        h.update([0]);
        h.update(nonce.as_bytes());
        let key = crate::auth::keys::hex(&h.finalize());
        self.shared
            .insert_new(
                Space::Nonce,
                &key,
                "",
                until.saturating_mul(1000).saturating_add(1000),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors() -> Vec<Value> {
        let path = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/signature-test-vectors.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn key(v: &Value) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD
            .decode(v["key_base64"].as_str().unwrap())
            .unwrap()
    }

    fn headers(v: &Value) -> Vec<(String, String)> {
        v["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect()
    }

    fn target(v: &Value) -> String {
        v["request_line"]
            .as_str()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .to_owned()
    }

    /// The GET upgrade request of a Genesys vector, owned.
    struct Owned {
        headers: Vec<(String, String)>,
        host: String,
        target: String,
    }

    impl Owned {
        fn of(v: &Value) -> Self {
            let headers = headers(v);
            let host = headers.iter().find(|(k, _)| k == "Host").unwrap().1.clone();
            Self {
                target: target(v),
                host,
                headers,
            }
        }

        fn parts(&self) -> RequestParts<'_> {
            RequestParts {
                method: "GET",
                target: &self.target,
                authority: &self.host,
                headers: &self.headers,
            }
        }
    }

    #[test]
    fn rfc_9421_b_2_5() {
        let v = &vectors()[0];
        let headers = vec![
            ("Host".to_owned(), "example.com".to_owned()),
            (
                "Date".to_owned(),
                "Tue, 20 Apr 2021 02:07:55 GMT".to_owned(),
            ),
            ("Content-Type".to_owned(), "application/json".to_owned()),
        ];
        let req = RequestParts {
            method: "POST",
            target: "/foo?param=Value&Pet=dog",
            authority: "example.com",
            headers: &headers,
        };
        let input = parse_input(v["signature_input"].as_str().unwrap(), None).unwrap();
        assert_eq!(
            signature_base(&req, &input).unwrap(),
            v["signature_base"].as_str().unwrap()
        );
        let policy = Policy {
            required: Vec::new(),
            max_age_s: None,
            skew_s: 0,
            min_nonce: None,
        };
        verify(
            &req,
            v["signature_input"].as_str().unwrap(),
            v["signature"].as_str().unwrap(),
            &key(v),
            Some("test-shared-secret"),
            0,
            &policy,
        )
        .unwrap();
    }

    #[test]
    fn signing_reproduces_the_genesys_example_and_verifies() {
        let v = &vectors()[1];
        let owned = Owned::of(v);
        let req = owned.parts();
        let expected = parse_input(v["signature_input"].as_str().unwrap(), None).unwrap();
        let int = |k: &str| expected.params[k].parse::<i64>().unwrap();
        let params = SignParams {
            keyid: &expected.params["keyid"],
            nonce: &expected.params["nonce"],
            created: int("created"),
            expires: int("expires"),
        };
        let (input, signature) = sign(&req, &params, &key(v)).unwrap();
        assert_eq!(input, v["signature_input"].as_str().unwrap());
        assert_eq!(signature, v["signature"].as_str().unwrap());

        // A fresh signature with a random nonce verifies under the AudioHook policy.
        let secret = v["key_base64"].as_str().unwrap();
        let (input, signature) = sign_audiohook(&req, params.keyid, secret, 1_700_000_000).unwrap();
        let verified = verify(
            &req,
            &input,
            &signature,
            &key(v),
            Some(params.keyid),
            1_700_000_001,
            &Policy::audiohook(),
        )
        .unwrap();
        assert_eq!(verified.created, Some(1_700_000_000));
        assert!(sign_audiohook(&req, params.keyid, "not base64!", 0).is_err());
    }

    #[test]
    fn genesys_documentation_example_and_live_capture() {
        for (i, v) in vectors().iter().enumerate().skip(1) {
            let owned = Owned::of(v);
            let req = owned.parts();
            let input = parse_input(v["signature_input"].as_str().unwrap(), None).unwrap();
            if let Some(base) = v["signature_base"].as_str() {
                assert_eq!(signature_base(&req, &input).unwrap(), base);
            }
            let created: i64 = input.params["created"].parse().unwrap();
            let keyid = input.params["keyid"].clone();
            let mut policy = Policy::audiohook();
            // The documentation's nonce is 24 characters; both pass the 22 minimum.
            policy.min_nonce = Some(22);
            let sig_input = v["signature_input"].as_str().unwrap();
            let sig = v["signature"].as_str().unwrap();
            verify(
                &req,
                sig_input,
                sig,
                &key(v),
                Some(&keyid),
                created + 2,
                &policy,
            )
            .unwrap_or_else(|e| panic!("vector {i}: {e}"));
            // Too old, from the future, another key, a changed header, a short nonce policy.
            assert_eq!(
                verify(
                    &req,
                    sig_input,
                    sig,
                    &key(v),
                    Some(&keyid),
                    created + 14,
                    &policy
                ),
                Err(SignatureError::Time)
            );
            assert_eq!(
                verify(
                    &req,
                    sig_input,
                    sig,
                    &key(v),
                    Some(&keyid),
                    created - 4,
                    &policy
                ),
                Err(SignatureError::Time)
            );
            assert_eq!(
                verify(
                    &req,
                    sig_input,
                    sig,
                    b"another key",
                    Some(&keyid),
                    created,
                    &policy
                ),
                Err(SignatureError::Mismatch)
            );
            assert_eq!(
                verify(
                    &req,
                    sig_input,
                    sig,
                    &key(v),
                    Some("other"),
                    created,
                    &policy
                ),
                Err(SignatureError::KeyId)
            );
            let mut tampered = owned.headers.clone();
            tampered
                .iter_mut()
                .find(|(k, _)| k == "Audiohook-Session-Id")
                .unwrap()
                .1 = "00000000-0000-0000-0000-000000000000".into();
            let req2 = RequestParts {
                headers: &tampered,
                ..req.clone()
            };
            assert_eq!(
                verify(
                    &req2,
                    sig_input,
                    sig,
                    &key(v),
                    Some(&keyid),
                    created,
                    &policy
                ),
                Err(SignatureError::Mismatch)
            );
            let strict = Policy {
                min_nonce: Some(32),
                ..policy.clone()
            };
            assert_eq!(
                verify(
                    &req,
                    sig_input,
                    sig,
                    &key(v),
                    Some(&keyid),
                    created,
                    &strict
                ),
                Err(SignatureError::Nonce)
            );
        }
    }

    #[test]
    fn uncovered_components_and_bad_headers_are_refused() {
        let headers = vec![("Host".to_owned(), "h".to_owned())];
        let req = RequestParts {
            method: "GET",
            target: "/",
            authority: "h",
            headers: &headers,
        };
        let input =
            "sig1=(\"@authority\");created=1;keyid=\"k\";nonce=\"aaaaaaaaaaaaaaaaaaaaaaaa\"";
        assert!(matches!(
            verify(
                &req,
                input,
                "sig1=:AAAA:",
                b"k",
                Some("k"),
                1,
                &Policy::audiohook()
            ),
            Err(SignatureError::Component(_))
        ));
        assert_eq!(
            parse_input("garbage", None),
            Err(SignatureError::Malformed("Signature-Input"))
        );
        assert_eq!(
            parse_signature("sig1=nocolons", "sig1"),
            Err(SignatureError::Malformed("Signature"))
        );
        let alg = "sig1=(\"@authority\");alg=\"rsa-pss-sha512\"";
        let open = Policy {
            required: Vec::new(),
            max_age_s: None,
            skew_s: 0,
            min_nonce: None,
        };
        assert_eq!(
            verify(&req, alg, "sig1=:AAAA:", b"k", None, 0, &open),
            Err(SignatureError::Algorithm)
        );
    }

    #[test]
    fn extreme_times_are_refused_without_overflow() {
        let owned = Owned::of(&vectors()[1]);
        let req = owned.parts();
        let policy = Policy::audiohook();
        for (created, expires) in [
            (i64::MAX, i64::MAX),
            (i64::MIN, i64::MAX),
            (1_700_000_000, i64::MIN),
            (1_700_000_000, i64::MAX),
        ] {
            let input = format!(
                "sig1=(\"@request-target\" \"@authority\" \"audiohook-organization-id\" \
                 \"audiohook-session-id\" \"audiohook-correlation-id\" \"x-api-key\");\
                 keyid=\"k\";nonce=\"0123456789abcdefghijklmn\";alg=\"hmac-sha256\";\
                 created={created};expires={expires}"
            );
            let result = verify(
                &req,
                &input,
                "sig1=:AAAA:",
                b"key",
                Some("k"),
                1_700_000_000,
                &policy,
            );
            assert!(result.is_err(), "{created} {expires}");
        }
    }

    proptest::proptest! {
        /// Header values from strangers are parsed or refused, never a panic.
        #[test]
        fn any_signature_headers_are_refused_or_parsed(input in ".{0,200}", signature in ".{0,120}", now in proptest::prelude::any::<i64>()) {
            let owned = Owned::of(&vectors()[1]);
            let req = owned.parts();
            let _ = parse_input(&input, None);
            let _ = parse_signature(&signature, "sig1");
            let _ = verify(&req, &input, &signature, b"key", Some("k"), now, &Policy::audiohook());
        }

        /// Structured input close to a real header, with numbers anywhere in i64.
        #[test]
        fn signature_params_with_any_numbers_never_panic(
            created in proptest::prelude::any::<i64>(),
            expires in proptest::prelude::any::<i64>(),
            now in proptest::prelude::any::<i64>(),
        ) {
            let owned = Owned::of(&vectors()[1]);
            let req = owned.parts();
            let input = format!(
                "sig1=(\"@request-target\" \"@authority\" \"audiohook-organization-id\" \
                 \"audiohook-session-id\" \"audiohook-correlation-id\" \"x-api-key\");\
                 keyid=\"k\";nonce=\"0123456789abcdefghijklmn\";created={created};expires={expires}"
            );
            let _ = verify(&req, &input, "sig1=:AAAA:", b"key", Some("k"), now, &Policy::audiohook());
        }
    }
}
