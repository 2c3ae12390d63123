//! Signing in to the dashboard from tests.

use super::{Env, Server};

/// A dashboard user of `org` with `password`, and an HTTP client that does not follow
/// redirects (sign-in answers 303).
pub fn user_and_client(env: &Env, org: &str, email: &str, password: &str) -> reqwest::Client {
    env.create_user(org, email, password);
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The sign-in form's single-use token and the pre-session cookie it is bound to.
pub async fn sign_in_form(client: &reqwest::Client, server: &Server) -> (String, String) {
    let resp = client
        .get(server.url("/dashboard/login"))
        .send()
        .await
        .unwrap();
    let cookie = resp.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = resp.text().await.unwrap();
    let start = page.find(r#"name="csrf" value=""#).unwrap() + 19;
    (page[start..].split('"').next().unwrap().to_owned(), cookie)
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form_body(fields: &[(&str, &str)]) -> String {
    let encode = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

pub async fn sign_in(
    client: &reqwest::Client,
    server: &Server,
    (token, cookie): &(String, String),
    email: &str,
    password: &str,
) -> reqwest::Response {
    client
        .post(server.url("/dashboard/login"))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&[
            ("csrf", token),
            ("email", email),
            ("password", password),
        ]))
        .send()
        .await
        .unwrap()
}

/// Signs in as `email` and returns the session cookie (`name=value`).
pub async fn session_cookie(
    client: &reqwest::Client,
    server: &Server,
    email: &str,
    password: &str,
) -> String {
    let form = sign_in_form(client, server).await;
    let resp = sign_in(client, server, &form, email, password).await;
    assert_eq!(resp.status(), 303, "sign-in failed");
    resp.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}
