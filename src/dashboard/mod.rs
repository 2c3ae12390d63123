//! The web dashboard at `/dashboard`: an organisation's administrators sign in and manage API
//! keys, AudioHook connectors, the system prompt and the MCP server, and watch usage and calls
//! in progress. Pages are rendered on the server ([`pages`]); the one script (copy buttons,
//! the live-call feed) and the stylesheet are served from `/dashboard/assets/`, so nothing is
//! fetched from elsewhere.
//!
//! Security:
//! - Passwords are argon2id hashes.
//! - Sessions are random 256-bit tokens in an `HttpOnly`, `SameSite=Strict` cookie scoped to
//!   `/dashboard`. The cookie is `Secure` when the request came over TLS: the proxy in front says
//!   so with `X-Forwarded-Proto: https`, or the request is for the host of an https
//!   `server.public_url`. Sessions last 12 hours
//!   and live in memory (a restart signs everyone out).
//! - Every form carries the session's CSRF token; the sign-in form carries one bound to a
//!   short-lived pre-session cookie.
//! - Every operation is checked against the signed-in user's organisation: another
//!   organisation's key or connector is "not found".
//! - Responses carry a strict Content-Security-Policy (no inline script, same-origin only).

pub mod history;
pub mod pages;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use futures_util::StreamExt;
use warp::http::{Response, StatusCode};
use warp::hyper::Body;
use warp::{Filter, Rejection, Reply};

use crate::admin::{AdminError, AdminRequest, AdminResponse};
use crate::app::App;
use crate::auth::sessions::{Session, SignInRefused, SESSION_MS};
use crate::clock;
use crate::store::{McpIntegration, Org};

/// Name of the session cookie.
const SESSION_COOKIE: &str = "cs_session";
/// Name of the pre-session cookie that binds the sign-in form's CSRF token.
const LOGIN_COOKIE: &str = "cs_login";
/// Largest form body.
const MAX_FORM: u64 = 64 * 1024;

/// What a request brings: its cookies, whether cookies are set `Secure`, and the client's
/// address.
#[derive(Debug, Clone)]
struct Ctx {
    session_id: Option<String>,
    login_token: Option<String>,
    secure: bool,
    address: String,
}

fn ctx(app: App) -> impl Filter<Extract = (Ctx,), Error = Rejection> + Clone {
    // Cookies are `Secure` when the service is published over https, whatever a request's
    // headers say (a client can write `X-Forwarded-Proto` as well as a proxy can).
    let secure = app.config.server.public_url.starts_with("https://");
    warp::cookie::optional::<String>(SESSION_COOKIE)
        .and(warp::cookie::optional::<String>(LOGIN_COOKIE))
        .and(app.peers.client_addr())
        .map(
            move |session_id, login_token, address: std::net::IpAddr| Ctx {
                address: address.to_string(),
                session_id,
                login_token,
                secure,
            },
        )
}

fn cookie(name: &str, value: &str, max_age_s: i64, secure: bool) -> String {
    format!(
        "{name}={value}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    )
}

pub(crate) fn html(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/html; charset=utf-8")
        .header("cache-control", "no-store")
        .header(
            "content-security-policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        )
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "same-origin")
        .body(Body::from(body))
        .expect("static headers are valid")
}

fn redirect(to: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header("location", to)
        .body(Body::empty())
        .expect("static headers are valid")
}

type Form = HashMap<String, String>;

fn field<'a>(form: &'a Form, name: &str) -> &'a str {
    form.get(name).map_or("", |s| s.as_str())
}

/// The session of a request, or the response that sends it to sign in.
async fn signed_in(app: &App, ctx: &Ctx) -> Result<Session, Box<Response<Body>>> {
    app.sessions
        .get(ctx.session_id.as_deref())
        .await
        .ok_or_else(|| Box::new(redirect("/dashboard/login")))
}

/// The session of a form post whose CSRF token matches, or the response to send instead.
async fn posted(app: &App, ctx: &Ctx, form: &Form) -> Result<Session, Box<Response<Body>>> {
    let session = signed_in(app, ctx).await?;
    if !constant_eq(field(form, "csrf"), &session.csrf) {
        return Err(Box::new(html(
            StatusCode::FORBIDDEN,
            pages::message("Refused", "The form was stale or not sent from this dashboard. Go back, reload the page and try again."),
        )));
    }
    Ok(session)
}

fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

async fn admin(app: &App, request: AdminRequest) -> Result<AdminResponse, AdminError> {
    app.admin.execute(request).await
}

/// A 500 page: the cause is logged, never shown.
pub(crate) fn failure(e: impl std::fmt::Display) -> Response<Body> {
    tracing::error!(error = %e, "dashboard request failed");
    html(
        StatusCode::INTERNAL_SERVER_ERROR,
        pages::message(
            "Something went wrong",
            "The request could not be completed. Please try again shortly.",
        ),
    )
}

/// Every dashboard route.
pub fn routes(app: App) -> impl Filter<Extract = (impl Reply,), Error = Rejection> + Clone {
    let base = warp::path("dashboard");
    let with_app = {
        let app = app.clone();
        warp::any().map(move || app.clone())
    };
    let form = warp::body::content_length_limit(MAX_FORM).and(warp::body::form::<Form>());

    let root = base
        .and(warp::path::end())
        .and(warp::get())
        .map(|| redirect("/dashboard/keys"));
    let assets = base
        .and(warp::path("assets"))
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::get())
        .map(|name: String| pages::asset(&name));
    let login_page = base
        .and(warp::path("login"))
        .and(warp::path::end())
        .and(warp::get())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .then(|app: App, ctx: Ctx| async move { login_page(&app, &ctx).await });
    let login = base
        .and(warp::path("login"))
        .and(warp::path::end())
        .and(warp::post())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .and(form)
        .then(login);
    let logout = base
        .and(warp::path("logout"))
        .and(warp::path::end())
        .and(warp::post())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .and(form)
        .then(|app: App, ctx: Ctx, form: Form| async move {
            match posted(&app, &ctx, &form).await {
                Ok(_) => {
                    app.sessions.end(ctx.session_id.as_deref()).await;
                    let mut r = redirect("/dashboard/login");
                    r.headers_mut().insert(
                        "set-cookie",
                        cookie(SESSION_COOKIE, "", 0, ctx.secure)
                            .parse()
                            .expect("cookie is a valid header"),
                    );
                    r
                }
                Err(r) => *r,
            }
        });
    let get_page = base
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::get())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .then(|page: String, app: App, ctx: Ctx| async move {
            match signed_in(&app, &ctx).await {
                Ok(s) => page_for(&app, &s, &page, None).await,
                Err(r) => *r,
            }
        });
    let post_action = base
        .and(warp::path::param::<String>())
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::post())
        .and(with_app.clone())
        .and(ctx(app.clone()))
        .and(form)
        .then(
            |page: String, action: String, app: App, ctx: Ctx, form: Form| async move {
                match posted(&app, &ctx, &form).await {
                    Ok(s) => act(&app, &s, &page, &action, &form).await,
                    Err(r) => *r,
                }
            },
        );
    let history = history::routes(app.clone());
    let feed = base
        .and(warp::path!("calls" / "events"))
        .and(warp::get())
        .and(with_app)
        .and(ctx(app))
        .then(|app: App, ctx: Ctx| async move {
            match signed_in(&app, &ctx).await {
                Ok(s) => live_feed(&app, &ctx, s).await,
                Err(_) => Response::builder()
                    .status(StatusCode::UNAUTHORIZED)
                    .body(Body::empty())
                    .expect("static response"),
            }
        });
    root.or(assets)
        .unify()
        .or(login_page)
        .unify()
        .or(login)
        .unify()
        .or(logout)
        .unify()
        .or(feed)
        .unify()
        .or(history)
        .unify()
        .or(get_page)
        .unify()
        .or(post_action)
        .unify()
}

/// The sign-in page when the shared state (the database) cannot be reached.
fn sign_in_unavailable() -> Response<Body> {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::login(
            "",
            Some("Sign-in is unavailable right now. Please try again shortly."),
        ),
    )
}

/// The sign-in page, at most `dashboard.login_page_per_minute_per_address` a minute to one
/// address.
async fn login_page(app: &App, ctx: &Ctx) -> Response<Body> {
    match app.sign_in.page(&ctx.address).await {
        Ok(()) => login_form(app, ctx, None).await,
        Err(SignInRefused::TooMany(wait)) => {
            let mut r = html(
                StatusCode::TOO_MANY_REQUESTS,
                pages::message(
                    "Too many requests",
                    "This address asked for the sign-in page too often. Wait a minute and try again.",
                ),
            );
            r.headers_mut().insert("retry-after", retry_after(wait));
            r
        }
        Err(_) => sign_in_unavailable(),
    }
}

fn retry_after(wait: std::time::Duration) -> warp::http::HeaderValue {
    (wait.as_secs() + 1)
        .to_string()
        .parse()
        .expect("digits are a valid header")
}

async fn login_form(app: &App, ctx: &Ctx, error: Option<&str>) -> Response<Body> {
    let t = app.sign_in.issue();
    let mut r = html(
        if error.is_some() {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        },
        pages::login(&t, error),
    );
    r.headers_mut().insert(
        "set-cookie",
        cookie(LOGIN_COOKIE, &t, 1800, ctx.secure)
            .parse()
            .expect("cookie is a valid header"),
    );
    r
}

async fn login(app: App, ctx: Ctx, form: Form) -> Response<Body> {
    let token = field(&form, "csrf");
    // The form's token must be the one this browser was given (its cookie) and one the server
    // issued and has not seen used: a captured form cannot be replayed.
    let bound = ctx
        .login_token
        .as_deref()
        .is_some_and(|t| constant_eq(t, token));
    let email = field(&form, "email").trim().to_lowercase();
    let admitted = if bound {
        app.sign_in.admit(token, &ctx.address, &email).await
    } else {
        Err(SignInRefused::Form)
    };
    match admitted {
        Ok(()) => {}
        Err(SignInRefused::Form) => {
            return login_form(
                &app,
                &ctx,
                Some("The sign-in form expired. Please try again."),
            )
            .await
        }
        Err(SignInRefused::Unavailable) => return sign_in_unavailable(),
        Err(SignInRefused::TooMany(wait)) => {
            tracing::info!(address = %ctx.address, "dashboard sign-in attempts over the limit");
            let mut r = login_form(
                &app,
                &ctx,
                Some("Too many sign-in attempts. Wait a minute and try again."),
            )
            .await;
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut().insert("retry-after", retry_after(wait));
            return r;
        }
    }
    let password = field(&form, "password").to_owned();
    let user = app.store.user(&email).await.ok().flatten();
    let stored = user.as_ref().map(|u| u.password_hash.clone());
    // argon2 runs on the password threads, bounded; an unknown user costs the same time.
    let user = match app.sign_in.passwords.check(stored, password).await {
        Ok(true) => user,
        Ok(false) => None,
        Err(busy) => {
            let mut r = login_form(&app, &ctx, Some(&busy.to_string())).await;
            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return r;
        }
    };
    let live_org = match &user {
        Some(u) => app
            .store
            .org(&u.org_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|o| !o.deleted),
        None => false,
    };
    let (Some(user), true) = (user, live_org) else {
        tracing::info!("dashboard sign-in refused");
        app.sign_in.failed(&ctx.address, &email).await;
        return login_form(&app, &ctx, Some("Wrong email or password.")).await;
    };
    app.sign_in.succeeded(&ctx.address, &email).await;
    tracing::info!(org = %user.org_id, "dashboard sign-in");
    tracing::debug!(email = %user.email, org = %user.org_id, "dashboard sign-in of");
    let Some((id, _)) = app.sessions.start(user.email, user.org_id).await else {
        return sign_in_unavailable();
    };
    let mut r = redirect("/dashboard/keys");
    let headers = r.headers_mut();
    headers.append(
        "set-cookie",
        cookie(SESSION_COOKIE, &id, SESSION_MS / 1000, ctx.secure)
            .parse()
            .expect("cookie is a valid header"),
    );
    headers.append(
        "set-cookie",
        cookie(LOGIN_COOKIE, "", 0, ctx.secure)
            .parse()
            .expect("cookie is a valid header"),
    );
    r
}

/// Something to show above a page's content: a secret shown once, a result, an error.
pub enum Notice {
    /// A new API key.
    KeySecret(String),
    /// A connector's client id, secret and URL.
    ConnectorSecret {
        /// Client id.
        client_id: String,
        /// Client secret.
        secret: String,
        /// WebSocket URL.
        url: String,
    },
    /// An MCP test: the tools, or why it failed.
    McpTest(Result<Vec<(String, String)>, String>),
    /// A plain message.
    Info(String),
    /// An error.
    Error(String),
}

/// The organisation of a session, or the page that says why there is none.
async fn org_of(app: &App, s: &Session) -> Result<Org, Box<Response<Body>>> {
    match app.store.org(&s.org_id).await {
        Ok(Some(o)) if !o.deleted => Ok(o),
        Ok(_) => Err(Box::new(html(
            StatusCode::FORBIDDEN,
            pages::message(
                "Organisation deleted",
                "This organisation no longer exists.",
            ),
        ))),
        Err(e) => Err(Box::new(failure(e))),
    }
}

/// The session of a request and its organisation, or the response to send instead.
async fn signed_in_org(app: &App, ctx: &Ctx) -> Result<(Session, Org), Box<Response<Body>>> {
    let s = signed_in(app, ctx).await?;
    let org = org_of(app, &s).await?;
    Ok((s, org))
}

async fn page_for(app: &App, s: &Session, page: &str, notice: Option<Notice>) -> Response<Body> {
    let org = match org_of(app, s).await {
        Ok(o) => o,
        Err(r) => return *r,
    };
    let body = match page {
        "keys" => match admin(
            app,
            AdminRequest::KeyList {
                org: org.id.clone(),
            },
        )
        .await
        {
            Ok(AdminResponse::Keys { keys }) => pages::keys(s, &org, &keys, notice),
            Ok(_) => return failure("unexpected answer"),
            Err(e) => return failure(e),
        },
        "connectors" => match admin(
            app,
            AdminRequest::ConnectorList {
                org: org.id.clone(),
            },
        )
        .await
        {
            Ok(AdminResponse::Connectors {
                connectors,
                websocket_url,
            }) => pages::connectors(s, &org, &connectors, &websocket_url, notice),
            Ok(_) => return failure("unexpected answer"),
            Err(e) => return failure(e),
        },
        "settings" => {
            let choices = history::choices(app, &org).await;
            pages::settings(s, &org, &choices, notice)
        }
        "history" => {
            return history::list_page(app, s, &org, &HashMap::new(), notice).await;
        }
        "usage" => match app.auth.quotas().report(&org.id, clock::now_ms()).await {
            Ok(report) => pages::usage(s, &org, &report),
            Err(e) => return failure(e),
        },
        "calls" => pages::calls(
            s,
            &org,
            &app.calls.live.of_org(&org.id).await,
            &app.calls.live.refusals_of(&org.id),
        ),
        _ => {
            return html(
                StatusCode::NOT_FOUND,
                pages::message("Not found", "There is no such page."),
            )
        }
    };
    html(StatusCode::OK, body)
}

/// The key or connector of this organisation, or not found.
async fn owned(app: &App, s: &Session, page: &str, id: &str) -> bool {
    match page {
        "keys" => app
            .store
            .api_key(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|k| k.org_id == s.org_id),
        "connectors" => app
            .store
            .connector(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|(c, _)| c.org_id == s.org_id),
        _ => false,
    }
}

async fn act(app: &App, s: &Session, page: &str, action: &str, form: &Form) -> Response<Body> {
    let name = Some(field(form, "name").trim().to_owned()).filter(|n| !n.is_empty());
    let id = field(form, "id").to_owned();
    let org = s.org_id.clone();
    if matches!(action, "revoke" | "rotate") && !owned(app, s, page, &id).await {
        return page_for(
            app,
            s,
            page,
            Some(Notice::Error("No such record in this organisation.".into())),
        )
        .await;
    }
    let result = match (page, action) {
        ("keys", "create") => admin(app, AdminRequest::KeyCreate { org, name })
            .await
            .map(|r| match r {
                AdminResponse::KeyCreated { secret, .. } => Notice::KeySecret(secret),
                _ => Notice::Error("unexpected answer".into()),
            }),
        ("keys", "revoke") => admin(app, AdminRequest::KeyRevoke { key: id.clone() })
            .await
            .map(|_| {
                Notice::Info(format!(
                    "Key {id} revoked. Open realtime sessions of this key are closed."
                ))
            }),
        ("connectors", "create" | "rotate") => {
            let request = if action == "create" {
                AdminRequest::ConnectorCreate { org, name }
            } else {
                AdminRequest::ConnectorRotate {
                    client_id: id.clone(),
                }
            };
            admin(app, request).await.map(|r| match r {
                AdminResponse::ConnectorSecret {
                    connector,
                    client_secret,
                    websocket_url,
                } => Notice::ConnectorSecret {
                    client_id: connector.client_id,
                    secret: client_secret,
                    url: websocket_url,
                },
                _ => Notice::Error("unexpected answer".into()),
            })
        }
        ("connectors", "revoke") => admin(
            app,
            AdminRequest::ConnectorRevoke {
                client_id: id.clone(),
            },
        )
        .await
        .map(|_| Notice::Info(format!("Connector {id} revoked."))),
        ("settings", "prompt") => {
            let prompt = field(form, "system_prompt").trim().to_owned();
            admin(
                app,
                AdminRequest::OrgSetPrompt {
                    org,
                    system_prompt: Some(prompt).filter(|p| !p.is_empty()),
                },
            )
            .await
            .map(|_| Notice::Info("System prompt saved.".into()))
        }
        ("settings", "history") => history::save_settings(app, org, form).await,
        ("history", "delete") => {
            let notice = match app.store.org(&s.org_id).await {
                Ok(Some(o)) => history::delete(app, &o, &id, field(form, "confirm") == "yes").await,
                _ => Notice::Error("The organisation could not be read; try again.".into()),
            };
            Ok(notice)
        }
        ("settings", "mcp") => match mcp_of(form) {
            Ok(mut mcp) => {
                // No header lines: keep the stored headers.
                if let Some(m) = mcp
                    .as_mut()
                    .filter(|_| field(form, "headers").trim().is_empty())
                {
                    let stored = app.store.org(&s.org_id).await.ok().flatten();
                    if let Some(old) = stored.and_then(|o| o.mcp) {
                        m.headers = old.headers;
                    }
                }
                admin(app, AdminRequest::OrgSetMcp { org, mcp })
                    .await
                    .map(|_| Notice::Info("MCP server saved.".into()))
            }
            Err(e) => Ok(Notice::Error(e)),
        },
        ("settings", "mcp-test") => {
            let stored = app
                .store
                .org(&s.org_id)
                .await
                .ok()
                .flatten()
                .and_then(|o| o.mcp.clone().map(|m| (m, o.mcp_allow)));
            Ok(Notice::McpTest(match stored {
                None => Err("No MCP server is set.".to_owned()),
                Some((integration, allow)) => {
                    let timeout = Duration::from_millis(app.config.llm.mcp_timeout_ms);
                    let policy = app.chat.settings().mcp_policy.for_org(&allow);
                    match crate::llm::mcp::McpSession::connect(&integration, timeout, &policy).await
                    {
                        Ok(session) => {
                            let tools = session
                                .tools()
                                .iter()
                                .map(|t| (t.name.clone(), t.description.clone()))
                                .collect();
                            session.close().await;
                            Ok(tools)
                        }
                        Err(e) => Err(e.to_string()),
                    }
                }
            }))
        }
        _ => {
            return html(
                StatusCode::NOT_FOUND,
                pages::message("Not found", "There is no such action."),
            )
        }
    };
    // A plan's cap (keys, connectors) is said on the page, answered 429 as the API would.
    let capped = matches!(result, Err(AdminError::Cap(_)));
    let notice = result.unwrap_or_else(|e| Notice::Error(e.to_string()));
    let mut r = page_for(app, s, page, Some(notice)).await;
    if capped && r.status() == StatusCode::OK {
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    }
    if r.status() == StatusCode::OK {
        // The result page shows secrets once: never from a cache.
        r.headers_mut()
            .insert("cache-control", "no-store".parse().expect("valid"));
    }
    r
}

/// The MCP settings of a form: URL (empty or `clear` removes it) and `Name: value` lines.
fn mcp_of(form: &Form) -> Result<Option<McpIntegration>, String> {
    let url = field(form, "url").trim();
    if url.is_empty() || form.contains_key("clear") {
        return Ok(None);
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("The MCP URL must start with http:// or https://.".into());
    }
    let mut headers = std::collections::BTreeMap::new();
    for line in field(form, "headers")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| format!("Header line {line:?} is not \"Name: value\"."))?;
        headers.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(Some(McpIntegration {
        url: url.to_owned(),
        headers,
    }))
}

/// Server-sent events of the organisation's calls: a snapshot, then every change. A session
/// holds at most `dashboard.max_feeds_per_session` feeds at once (429 past that).
async fn live_feed(app: &App, ctx: &Ctx, s: Session) -> Response<Body> {
    let session_id = ctx.session_id.as_deref().unwrap_or_default();
    let max = app.config.dashboard.max_feeds_per_session;
    let place = match app
        .slots
        .try_acquire(&format!("feeds:session:{session_id}"), max)
        .await
    {
        Ok(place) => place,
        Err(e) => return failure(e),
    };
    let Some(place) = place else {
        return Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "5")
            .body(Body::from(format!(
                "this session already has {max} live feeds open"
            )))
            .expect("static response");
    };
    let snapshot =
        serde_json::json!({"type": "snapshot", "calls": app.calls.live.of_org(&s.org_id).await});
    let feed = tokio_stream_of(app.calls.live.subscribe(), s.org_id);
    let first =
        futures_util::stream::once(
            async move { Ok::<_, Infallible>(format!("data: {snapshot}\n\n")) },
        );
    let keepalive = futures_util::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(15)).await;
        Some((Ok::<_, Infallible>(": keepalive\n\n".to_owned()), ()))
    });
    // The feed never ends by itself: it ends when the server stops, so a graceful stop does not
    // wait on an open page.
    let stream = first
        .chain(futures_util::stream::select(feed, keepalive))
        .take_until(app.lifecycle.stopped())
        // The feed's place is given back when the stream is dropped (the page went away).
        .inspect(move |_| {
            let _ = &place;
        });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-store")
        .body(Body::wrap_stream(stream.map(|r| r.map(bytes::Bytes::from))))
        .expect("static headers are valid")
}

fn tokio_stream_of(
    rx: tokio::sync::broadcast::Receiver<(String, String)>,
    org_id: String,
) -> impl futures_util::Stream<Item = Result<String, Infallible>> {
    futures_util::stream::unfold((rx, org_id), |(mut rx, org_id)| async move {
        loop {
            match rx.recv().await {
                Ok((org, data)) if org == org_id => {
                    return Some((Ok(format!("data: {data}\n\n")), (rx, org_id)));
                }
                Ok(_) => continue,
                // Fell behind: tell the page to reload its snapshot.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    return Some((
                        Ok("data: {\"type\":\"reload\"}\n\n".to_owned()),
                        (rx, org_id),
                    ));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}
