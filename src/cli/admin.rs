//! Text output of the admin commands.

use callstream::admin::{AdminResponse, ConnectorView, KeyView, OrgView};

/// Prints an admin response for people.
pub fn print_text(response: &AdminResponse) {
    match response {
        AdminResponse::Org(o) => print_org(o),
        AdminResponse::Orgs { orgs } => {
            if orgs.is_empty() {
                println!("no organisations");
            }
            orgs.iter().for_each(print_org);
        }
        AdminResponse::KeyCreated { key, secret } => {
            print_key(key);
            println!("secret      {secret}");
            println!("(the secret is shown this once; store it now)");
        }
        AdminResponse::Key(k) => print_key(k),
        AdminResponse::Keys { keys } => {
            if keys.is_empty() {
                println!("no API keys");
            }
            keys.iter().for_each(print_key);
        }
        AdminResponse::ConnectorSecret {
            connector,
            client_secret,
            websocket_url,
        } => {
            print_connector(connector);
            println!("client secret  {client_secret}");
            println!("websocket url  {websocket_url}");
            println!("(the client secret is shown this once; store it now)");
        }
        AdminResponse::Connector(c) => print_connector(c),
        AdminResponse::Connectors {
            connectors,
            websocket_url,
        } => {
            if connectors.is_empty() {
                println!("no connectors");
            }
            connectors.iter().for_each(print_connector);
            println!("websocket url  {websocket_url}");
        }
        AdminResponse::User { email, org_id } => {
            println!("dashboard user {email} of {org_id}: sign in at /dashboard");
        }
        AdminResponse::Server { location, .. } => {
            println!("the server keeps its data in {location}")
        }
        AdminResponse::Usage(report) => {
            println!(
                "organisation {}  plan {}  month {}",
                report.org_id, report.plan, report.month
            );
            let t = &report.chat_tokens;
            println!(
                "chat tokens      used {}  quota {}  remaining {}",
                t.used,
                opt(t.quota),
                opt(t.remaining)
            );
            let a = &report.audio_seconds;
            let minutes = |s: f64| format!("{:.2}", s / 60.0);
            println!(
                "audio minutes    used {}  quota {}  remaining {}",
                minutes(a.used),
                a.quota.map_or("unlimited".into(), minutes),
                a.remaining.map_or("unlimited".into(), minutes)
            );
            for day in &report.days {
                println!("  {}  {:?}  {}", day.day, day.kind, day.amount);
            }
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
}

fn print_org(o: &OrgView) {
    let state = if o.deleted { "  (deleted)" } else { "" };
    let retention = o
        .retention_days
        .map_or_else(|| "forever".to_owned(), |d| format!("{d}d"));
    let redact = if o.history.redact { "on" } else { "off" };
    let overrides: String = o
        .history
        .redact_connectors
        .iter()
        .map(|(id, on)| format!(" {id}={}", if *on { "on" } else { "off" }))
        .collect();
    println!(
        "{}  {}  plan={}  created={}  retention={retention}  redact={redact}{overrides}{state}",
        o.id, o.name, o.plan, o.created_at
    );
}

fn print_key(k: &KeyView) {
    let state = k
        .revoked_at
        .as_deref()
        .map(|t| format!("  revoked={t}"))
        .unwrap_or_default();
    let name = k.name.as_deref().unwrap_or("-");
    println!(
        "{}  org={}  name={name}  ...{}  created={}{state}",
        k.id, k.org_id, k.last4, k.created_at
    );
}

fn print_connector(c: &ConnectorView) {
    let name = c.name.as_deref().unwrap_or("-");
    let rotated = c
        .rotated_at
        .as_deref()
        .map(|t| format!("  rotated={t}"))
        .unwrap_or_default();
    let revoked = c
        .revoked_at
        .as_deref()
        .map(|t| format!("  revoked={t}"))
        .unwrap_or_default();
    println!(
        "client id      {}  org={}  name={name}  created={}{rotated}{revoked}",
        c.client_id, c.org_id, c.created_at
    );
}
