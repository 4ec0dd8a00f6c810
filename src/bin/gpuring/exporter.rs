//! `gpuring exporter`: serves the rings' Prometheus metrics ([`gpuring::metrics`]) over HTTP.
//!
//! `GET /metrics` (or `HEAD`) answers the OpenMetrics text of every ring in /dev/shm, or of the
//! rings named; any other path is 404, any other method on `/metrics` 405. Each scrape reads
//! the rings anew; nothing is cached. It runs until it is killed. docs/metrics.md has the list
//! of metrics and a Prometheus scrape config.

use std::process::ExitCode;

use gpuring::metrics::{self, Rings};
use prometheus_client::registry::Registry;
use tiny_http::{Header, Method, Request, Response, Server};

/// `gpuring exporter`'s arguments.
#[derive(clap::Args)]
pub struct Options {
    /// The address to listen on (port 0: any free port; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: String,
    /// The rings to export (default: every ring in /dev/shm, listed again at each scrape).
    pub names: Vec<String>,
}

/// Serves `/metrics` until killed; returns only when it cannot listen (exit status 1).
pub fn run(o: &Options) -> ExitCode {
    let rings = if o.names.is_empty() { Rings::All } else { Rings::Names(o.names.clone()) };
    let mut registry = Registry::default();
    metrics::register(&mut registry, rings);
    let server = match Server::http(o.listen.as_str()) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("gpuring exporter: cannot listen on {}: {e}", o.listen);
            return ExitCode::FAILURE;
        }
    };
    match server.server_addr().to_ip() {
        Some(addr) => eprintln!("gpuring exporter: serving http://{addr}/metrics"),
        None => eprintln!("gpuring exporter: serving {}/metrics", server.server_addr()),
    }
    // One request at a time: a scrape reads a few counters per ring, and Prometheus scrapes
    // once every few seconds.
    for request in server.incoming_requests() {
        answer(request, &registry);
    }
    // `incoming_requests` ends only when the listening socket fails.
    eprintln!("gpuring exporter: the listening socket failed");
    ExitCode::FAILURE
}

/// Answers one request: the metrics, 404 or 405. A client that went away is not an error.
fn answer(request: Request, registry: &Registry) {
    let path = request.url().split('?').next().unwrap_or_default();
    let response = match (path, request.method()) {
        ("/metrics", Method::Get | Method::Head) => match metrics::encode_text(registry) {
            Ok(text) => {
                let content_type = Header::from_bytes("Content-Type", metrics::CONTENT_TYPE)
                    .expect("the content type is a valid header");
                Response::from_string(text).with_header(content_type)
            }
            // Only a collector other than the rings' can fail; none is registered here.
            Err(_) => Response::from_string("encoding the metrics failed\n").with_status_code(500),
        },
        ("/metrics", _) => Response::from_string("only GET and HEAD\n").with_status_code(405),
        _ => {
            Response::from_string("not found: the metrics are at /metrics\n").with_status_code(404)
        }
    };
    // The scraper may have hung up; the next scrape is a new request.
    let _ = request.respond(response);
}
