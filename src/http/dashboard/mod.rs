//! The web dashboard, `/`: plain HTML, CSS and JavaScript built into the binary (no
//! framework, no CDN, no build step), served wherever the HTTP API is. The page holds no
//! data: everything it shows it reads from `/api/v1` with the caller's token, which the
//! page asks for and keeps in the tab's sessionStorage (see `assets/core.js`).
//!
//! Assets are `/ui/{name}`; the page names each with `?v=` and the first 16 hex digits
//! of its sha256, so a browser keeps them for good (`immutable`) and a new build is a new
//! URL; every answer carries an `ETag` (`If-None-Match` → 304) and a strict
//! Content-Security-Policy: scripts, styles, workers and connections from this origin
//! only, no inline code, no frames.

use std::sync::OnceLock;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

/// Everything the page may load, and from where: this origin only, nothing inline.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; worker-src 'self'; \
    base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An asset built into the binary.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

/// An asset of `assets/` by its file name, built into the binary.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("assets/", $name)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("sha256.js", JS),
    asset!("core.js", JS),
    asset!("pages.js", JS),
    asset!("graphs.js", JS),
    asset!("upload.js", JS),
    asset!("upload-worker.js", JS),
];

const INDEX: &str = include_str!("assets/index.html");

/// The page with its asset URLs filled in, and every ETag (the digests' first 16 hex
/// digits), computed once.
struct Built {
    index: String,
    index_tag: String,
    tags: Vec<String>,
}

fn tag(body: &[u8]) -> String {
    hex::encode(&Sha256::digest(body)[..8])
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let tags: Vec<String> = ASSETS.iter().map(|a| tag(a.body)).collect();
        let mut index = INDEX.to_string();
        for (a, t) in ASSETS.iter().zip(&tags) {
            index = index.replace(
                &format!("{{{{{}}}}}", a.name),
                &format!("/ui/{}?v={t}", a.name),
            );
        }
        let index_tag = tag(index.as_bytes());
        Built {
            index,
            index_tag,
            tags,
        }
    })
}

/// Registers `/` and `/ui/{name}` (open: they hold no data).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/ui/{name}", web::get().to(asset));
}

async fn index(req: HttpRequest) -> HttpResponse {
    let b = built();
    answer(
        &req,
        &b.index_tag,
        "text/html; charset=utf-8",
        b.index.as_bytes(),
        "no-cache",
    )
}

async fn asset(req: HttpRequest, name: web::Path<String>) -> HttpResponse {
    let b = built();
    let Some((a, t)) = ASSETS.iter().zip(&b.tags).find(|(a, _)| a.name == *name) else {
        let mut r = HttpResponse::NotFound();
        return with_policy(&mut r)
            .content_type("text/plain; charset=utf-8")
            .body(format!(
                "no dashboard asset {:?}; the dashboard is at /",
                name.as_str()
            ));
    };
    // The URL the page names (with this build's digest) never changes meaning; any
    // other is checked again every time.
    let versioned = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map(|q| q.iter().any(|(k, v)| k == "v" && v == t))
        .unwrap_or(false);
    let cache = if versioned {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    answer(&req, t, a.content_type, a.body, cache)
}

fn answer(
    req: &HttpRequest,
    tag: &str,
    content_type: &'static str,
    body: &'static [u8],
    cache: &'static str,
) -> HttpResponse {
    let etag = format!("\"{tag}\"");
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r = if fresh {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    with_policy(&mut r)
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, HeaderValue::from_static(cache)));
    if fresh {
        r.finish()
    } else {
        r.content_type(content_type).body(body)
    }
}

fn with_policy(r: &mut actix_web::HttpResponseBuilder) -> &mut actix_web::HttpResponseBuilder {
    r.insert_header((
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    ))
    .insert_header((
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    ))
    .insert_header((
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    ))
    .insert_header((header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_every_asset_by_digest_and_nothing_else() {
        let b = built();
        assert!(
            !b.index.contains("{{"),
            "a placeholder is left: {}",
            b.index
        );
        for (a, t) in ASSETS.iter().zip(&b.tags) {
            assert!(
                b.index.contains(&format!("/ui/{}?v={t}", a.name)),
                "{} is not named by its digest",
                a.name
            );
        }
        // Nothing inline that the policy would block.
        assert!(!b.index.contains("<script>") && !b.index.contains(" style="));
    }
}
