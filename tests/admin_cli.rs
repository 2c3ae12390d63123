//! The admin CLI against a real data directory: round trips, clear errors, and the same
//! commands through the admin socket of a running server.

mod common;

use common::Env;

#[test]
fn org_key_connector_round_trips() {
    let env = Env::new(&[("CALLSTREAM_SERVER__PUBLIC_URL", "https://calls.example.com")]);

    let org = env.cli_json(&["org", "create", "Acme Support", "--plan", "team"]);
    let org_id = org["id"].as_str().unwrap();
    assert!(org_id.starts_with("org_"));
    assert_eq!(
        (org["plan"].as_str(), org["deleted"].as_bool()),
        (Some("team"), Some(false))
    );
    let list = env.cli_json(&["org", "list"]);
    assert_eq!(list["orgs"].as_array().unwrap().len(), 1);
    assert_eq!(list["orgs"][0]["name"], "Acme Support");

    // Keys: the secret once, then only the last four characters.
    let created = env.cli_json(&["key", "create", org_id, "--name", "crm"]);
    let secret = created["secret"].as_str().unwrap();
    let key_id = created["key"]["id"].as_str().unwrap();
    assert_eq!(created["key"]["last4"], &secret[secret.len() - 4..]);
    let listed = env.cli(&["--json", "key", "list", org_id]);
    let listed_text = String::from_utf8(listed.stdout).unwrap();
    assert!(
        !listed_text.contains(secret),
        "a listing never shows the secret"
    );
    let listed: serde_json::Value = serde_json::from_str(&listed_text).unwrap();
    assert_eq!(listed["keys"][0]["id"], key_id);
    assert_eq!(listed["keys"][0]["name"], "crm");
    assert!(listed["keys"][0]["revoked_at"].is_null());
    let revoked = env.cli_json(&["key", "revoke", key_id]);
    assert!(revoked["revoked_at"].is_string());
    let listed = env.cli_json(&["key", "list", org_id]);
    assert!(listed["keys"][0]["revoked_at"].is_string());

    // Connectors: client id, client secret once, the fixed URL.
    let conn = env.cli_json(&["connector", "create", org_id, "--name", "genesys"]);
    let client_id = conn["connector"]["client_id"].as_str().unwrap();
    let first_secret = conn["client_secret"].as_str().unwrap().to_owned();
    assert_eq!(
        conn["websocket_url"],
        "wss://calls.example.com/api/callstream/ws"
    );
    assert_eq!(first_secret.len(), 44, "base64 of 32 bytes");
    let listed = env.cli_json(&["connector", "list", org_id]);
    assert_eq!(listed["connectors"][0]["client_id"], client_id);
    assert!(!listed.to_string().contains(&first_secret));
    let rotated = env.cli_json(&["connector", "rotate", client_id]);
    assert_ne!(rotated["client_secret"].as_str().unwrap(), first_secret);
    assert!(rotated["connector"]["rotated_at"].is_string());
    let revoked = env.cli_json(&["connector", "revoke", client_id]);
    assert!(revoked["revoked_at"].is_string());
    let again = env.cli(&["connector", "rotate", client_id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("revoked"));

    let usage = env.cli_json(&["usage", org_id]);
    assert_eq!(usage["plan"], "team");
    assert_eq!(usage["chat_tokens"]["used"], 0);
    assert_eq!(usage["audio_seconds"]["quota"], 600_000.0);

    // Text output for people shows the secret with a warning.
    let text = env.cli(&["key", "create", org_id]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("secret      cs_") && text.contains("shown this once"),
        "{text}"
    );
}

#[test]
fn unknown_ids_and_bad_input_are_clear_errors() {
    let env = Env::new(&[]);
    let cases: &[(&[&str], &str)] = &[
        (
            &["key", "create", "org_nope"],
            "no organisation with id org_nope",
        ),
        (
            &["key", "list", "org_nope"],
            "no organisation with id org_nope",
        ),
        (
            &["key", "revoke", "key_nope"],
            "no API key with id key_nope",
        ),
        (
            &["connector", "create", "org_nope"],
            "no organisation with id org_nope",
        ),
        (
            &["connector", "rotate", "cc_nope"],
            "no connector with client id cc_nope",
        ),
        (
            &["connector", "revoke", "cc_nope"],
            "no connector with id cc_nope",
        ),
        (
            &["org", "delete", "org_nope"],
            "no organisation with id org_nope",
        ),
        (&["usage", "org_nope"], "no organisation with id org_nope"),
        (
            &["org", "create", "X", "--plan", "platinum"],
            "unknown plan \"platinum\"",
        ),
    ];
    for (args, message) in cases {
        let out = env.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let org = env.cli_json(&["org", "create", "Gone"]);
    let org_id = org["id"].as_str().unwrap();
    env.cli_json(&["org", "delete", org_id]);
    let out = env.cli(&["key", "create", org_id]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is deleted"));
}

#[test]
fn cli_goes_through_the_admin_socket_while_the_server_runs() {
    let env = Env::new(&[]);
    let server = env.serve();
    let (org_id, _, _) = env.org_with_key("Acme");
    let keys = env.cli_json(&["key", "list", &org_id]);
    assert_eq!(keys["keys"].as_array().unwrap().len(), 1);
    let out = env.cli(&["key", "revoke", "key_nope"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no API key with id key_nope"));
    server.stop();
    // With the server gone the CLI opens the database itself and sees the same records.
    let keys = env.cli_json(&["key", "list", &org_id]);
    assert_eq!(keys["keys"].as_array().unwrap().len(), 1);
}
