//! What the data directory holds: no secret in plain text, and everything still there after
//! the server restarts, gracefully or not.

mod common;

use std::path::Path;

use base64::Engine as _;
use common::{get, Env};

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every byte of every file below `dir`.
fn all_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(all_files(&path));
        } else if path.is_file() {
            out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
    out
}

#[test]
fn no_secret_is_stored_in_plain_text() {
    let env = Env::new(&[]);
    let (org_id, _, api_secret) = env.org_with_key("Plaintext Probe Org");
    let conn = env.cli_json(&["connector", "create", &org_id]);
    let client_id = conn["connector"]["client_id"].as_str().unwrap().to_owned();
    let client_secret = conn["client_secret"].as_str().unwrap().to_owned();
    let raw_secret = base64::engine::general_purpose::STANDARD
        .decode(&client_secret)
        .unwrap();
    let rotated = env.cli_json(&["connector", "rotate", &client_id]);
    let rotated_secret = rotated["client_secret"].as_str().unwrap().to_owned();

    let files = all_files(&env.data_dir());
    assert!(!files.is_empty());
    // The scan does see what is stored in clear: names and ids.
    assert!(files
        .iter()
        .any(|(_, b)| contains(b, b"Plaintext Probe Org")));
    assert!(files.iter().any(|(_, b)| contains(b, client_id.as_bytes())));
    for (path, bytes) in &files {
        for (what, needle) in [
            ("API key", api_secret.as_bytes()),
            ("API key body", &api_secret.as_bytes()[3..]),
            ("client secret", client_secret.as_bytes()),
            ("raw client secret", &raw_secret[..]),
            ("rotated client secret", rotated_secret.as_bytes()),
        ] {
            assert!(
                !contains(bytes, needle),
                "{what} found in plain text in {path}"
            );
        }
    }
}

#[tokio::test]
async fn records_survive_restarts_and_kills() {
    let env = Env::new(&[]);
    let server = env.serve();
    let client = reqwest::Client::new();
    let (org_id, revoked_id, revoked_secret) = env.org_with_key("Acme");
    let (_, live_secret) = env.key(&org_id);
    env.cli_json(&["key", "revoke", &revoked_id]);
    let conn = env.cli_json(&["connector", "create", &org_id]);
    // No graceful shutdown: what was acknowledged must already be on disk.
    server.kill();

    let server = env.serve();
    let (status, _, body) = get(&client, &server.url("/api/account"), Some(&live_secret)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["organisation"]["id"], org_id.as_str());
    let (status, _, _) = get(&client, &server.url("/api/account"), Some(&revoked_secret)).await;
    assert_eq!(status, 401, "revocation survives");
    let listed = env.cli_json(&["connector", "list", &org_id]);
    assert_eq!(
        listed["connectors"][0]["client_id"],
        conn["connector"]["client_id"]
    );
    server.stop();

    let server = env.serve();
    let (status, _, _) = get(&client, &server.url("/api/usage"), Some(&live_secret)).await;
    assert_eq!(status, 200);
}
