//! `gpuring exporter` against a live host ring: fetched over HTTP with a real client (ureq) on
//! 127.0.0.1 and parsed with a Prometheus text-format parser (prometheus-parse).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::gpuring_bin;

use gpuring::{Consumer, Producer};
use prometheus_parse::{Scrape, Value};

/// Kills the exporter however the test ends.
struct Exporter(Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `gpuring exporter` on a free port for `names`; returns it and its base URL, read from
/// the address it prints on stderr.
fn start(names: &[&str]) -> (Exporter, String) {
    let mut child = Command::new(gpuring_bin())
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .args(names)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuring exporter");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let exporter = Exporter(child);
    let url = line
        .trim()
        .split_once("http://")
        .and_then(|(_, rest)| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (exporter, format!("http://{url}"))
}

/// Fetches and parses `/metrics`, checking the content type.
fn scrape(base: &str) -> Scrape {
    let mut response = ureq::get(&format!("{base}/metrics")).call().expect("GET /metrics");
    let content_type = response.headers().get("content-type").unwrap().to_str().unwrap();
    assert_eq!(content_type, gpuring::metrics::CONTENT_TYPE);
    let body = response.body_mut().read_to_string().unwrap();
    assert!(body.ends_with("# EOF\n"), "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The value of `metric`'s one sample whose labels include all of `labels`.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)));
    let sample = found.next()?;
    assert!(found.next().is_none(), "two samples of {metric} {labels:?}");
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
        _ => panic!("{metric} is not a scalar"),
    }
}

#[test]
fn exporter_serves_a_live_ring() {
    let name = format!("cli-exporter-{}", std::process::id());
    let mut tx = Producer::builder(&name).capacity(8).create().unwrap();
    let rx = Consumer::open(&name).unwrap();
    for i in 0..5u8 {
        tx.send(&[i], b"").unwrap();
    }
    for _ in 0..2 {
        drop(rx.recv().unwrap());
    }
    let held = rx.recv().unwrap(); // received and still held

    let (_exporter, base) = start(&[&name, "cli-exporter-no-such-ring"]);
    let s = scrape(&base);
    let ring = [("ring", name.as_str())];
    let pid = std::process::id().to_string();
    let consumer = [("ring", name.as_str()), ("entry", "0"), ("pid", pid.as_str())];
    assert_eq!(value(&s, "gpuring_up", &ring), Some(1.0));
    assert_eq!(value(&s, "gpuring_up", &[("ring", "cli-exporter-no-such-ring")]), Some(0.0));
    assert_eq!(value(&s, "gpuring_published_total", &ring), Some(5.0));
    assert_eq!(value(&s, "gpuring_producer_alive", &ring), Some(1.0));
    assert_eq!(value(&s, "gpuring_capacity", &ring), Some(8.0));
    assert_eq!(value(&s, "gpuring_producer_blocked_seconds_total", &ring), Some(0.0));
    assert!(value(&s, "gpuring_epoch", &ring).is_some());
    assert_eq!(value(&s, "gpuring_publish_rate", &ring), None, "no rate at the first scrape");
    assert_eq!(value(&s, "gpuring_consumer_received_total", &consumer), Some(3.0));
    assert_eq!(value(&s, "gpuring_consumer_lag", &consumer), Some(2.0));
    assert_eq!(value(&s, "gpuring_consumer_held", &consumer), Some(1.0));
    assert_eq!(value(&s, "gpuring_consumer_alive", &consumer), Some(1.0));
    assert_eq!(value(&s, "gpuring_consumer_lost_total", &consumer), Some(0.0));
    let mode = s.samples.iter().find(|x| x.metric == "gpuring_consumer_lag").unwrap();
    assert_eq!(mode.labels.get("mode"), Some("lossless"));
    drop(held);

    // A second scrape: the rate since the first, and the new counters.
    tx.send(b"x", b"").unwrap();
    let s = scrape(&base);
    assert_eq!(value(&s, "gpuring_published_total", &ring), Some(6.0));
    assert!(value(&s, "gpuring_publish_rate", &ring).is_some_and(|r| r > 0.0));
    assert_eq!(value(&s, "gpuring_consumer_held", &consumer), Some(0.0));
    assert_eq!(value(&s, "gpuring_consumer_lag", &consumer), Some(3.0));

    match ureq::get(&format!("{base}/other")).call() {
        Err(ureq::Error::StatusCode(404)) => {}
        other => panic!("expected 404, got {other:?}"),
    }
}
