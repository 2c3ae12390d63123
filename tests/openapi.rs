//! `GET /api/openapi.json` on the real server: served without a key, valid OpenAPI 3.1 by an
//! independent validator (openapi-spec-validator), and in step with the routes: every REST route
//! the sources declare is documented, every documented operation is answered, and nothing else.

mod common;

use std::collections::BTreeSet;

use common::Env;

/// `(METHOD, /path)` of every REST route declared in `src/http/` (`warp::path!` followed by
/// its method filter). WebSocket routes (`warp::ws()`) are left out: docs/api.md describes them.
fn declared_routes() -> BTreeSet<(String, String)> {
    let dir = callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut routes = BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let text = match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => &text[..],
        };
        for (at, _) in text.match_indices("warp::path!(") {
            let rest = &text[at + "warp::path!(".len()..];
            let close = rest.find(')').unwrap();
            // A typed segment (`String`) is a path parameter, `{id}` in the document.
            let path: String = rest[..close]
                .split('/')
                .map(|part| match part.trim() {
                    "String" => "/{id}".to_owned(),
                    part => format!("/{}", part.trim_matches('"')),
                })
                .collect();
            // The method filter that follows the path, before the next route.
            let after = &rest[close..];
            let next = after.find("warp::path!(").unwrap_or(after.len());
            let after = &after[..next];
            let method = ["get", "post", "put", "delete", "patch", "ws"]
                .into_iter()
                .filter_map(|m| after.find(&format!("warp::{m}()")).map(|i| (i, m)))
                .min()
                .map(|(_, m)| m)
                .unwrap_or_else(|| panic!("no method filter after warp::path!({path})"));
            if method != "ws" {
                routes.insert((method.to_uppercase(), path));
            }
        }
    }
    routes
}

fn documented_routes(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            routes.insert((method.to_uppercase(), path.clone()));
        }
    }
    routes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_valid_and_matches_the_routes() {
    let env = Env::new(&[("CALLSTREAM_SERVER__PUBLIC_URL", "https://calls.example.com")]);
    let server = env.serve();
    let http = reqwest::Client::new();

    let resp = http
        .get(server.url("/api/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "served without a key");
    assert_eq!(resp.headers()["content-type"], "application/json");
    let text = resp.text().await.unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1."),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["servers"][0]["url"], "https://calls.example.com");

    let file = env.dir.path().join("openapi.json");
    std::fs::write(&file, &text).unwrap();
    let verdict = common::python_json("validate_openapi.py", &[file.to_str().unwrap()]);
    assert_eq!(verdict["valid"], true, "{verdict}");

    // The document and the sources name the same routes.
    let declared = declared_routes();
    let documented = documented_routes(&doc);
    assert!(declared.contains(&("POST".into(), "/api/transcribe".into())));
    assert!(declared.contains(&("DELETE".into(), "/api/calls/{id}".into())));
    assert_eq!(documented, declared);

    // And the server answers each of them: a route it lacked would be 404 (or 405 for another
    // method), whatever the key.
    for (method, path) in &documented {
        let path = path.replace("{id}", "call_000000000000000000000000");
        let request = match method.as_str() {
            "GET" => http.get(server.url(&path)),
            "POST" => http.post(server.url(&path)),
            "DELETE" => http.delete(server.url(&path)),
            other => panic!("no request for {other}"),
        };
        let status = request.send().await.unwrap().status().as_u16();
        assert!(
            status != 404 && status != 405,
            "{method} {path} answered {status}"
        );
    }
    // A route that is neither declared nor documented is not answered.
    let status = http
        .get(server.url("/api/not-a-route"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404);
    let unknown_method = http
        .delete(server.url("/api/usage"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert!(matches!(unknown_method, 404 | 405), "{unknown_method}");
}
