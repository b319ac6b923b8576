//! Scrubbing a response body: 1 MiB and 16 MiB of JSON-ish log text (with the escapes a
//! real body has: `\n`, `\"`, `%20`, `&amp;`), once with no occurrence of the secret and
//! once with a few echoes in different forms. Also what building a redactor costs (once
//! per HTTP request or SSH command): for a token, and for an ed25519-sized key with its
//! lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use postern_broker::action::percent_encode;
use postern_broker::channel::redact::Redactor;

const SECRET: &str = "sk_live_51HxQ2eKb7Vn3pT9wYzA4cD";
const MIB: usize = 1 << 20;

/// `size` bytes of log lines; `hits` echoes of the secret spread through it.
fn body(size: usize, hits: usize) -> Vec<u8> {
    let line = "{\"ts\":\"2025-01-01T00:00:00Z\",\"level\":\"info\",\"msg\":\"GET /v1/items?q=a%20b \
                &amp; \\\"quoted\\\" done\\n\",\"id\":\"req_9f8e7d6c5b4a\",\"blob\":\"\
                dGhpcyBpcyBub3QgdGhlIHNlY3JldA==\"}\n";
    let mut out = Vec::with_capacity(size + MIB);
    while out.len() < size {
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(size);
    let forms = [
        SECRET.to_string(),
        hex::encode(SECRET),
        STANDARD.encode(format!("user:{SECRET}")),
        percent_encode(SECRET.as_bytes()),
        SECRET.bytes().map(|b| format!("\\u{b:04x}")).collect(),
    ];
    for i in 0..hits {
        let at = (size / (hits + 1)) * (i + 1);
        let form = forms[i % forms.len()].as_bytes();
        out.splice(at..at, form.iter().copied());
    }
    out
}

/// An OpenSSH-armored key of `raw` bytes, and what the SSH channel renders from it (each
/// line of the armored body, and the trimmed text).
fn key(raw: usize) -> (String, Vec<String>) {
    let bytes: Vec<u8> = (0..raw).map(|i| (i * 7919 % 251) as u8).collect();
    let body = STANDARD.encode(bytes);
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(70)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let text = format!(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
        lines.join("\n")
    );
    let mut rendered = lines;
    rendered.push(text.trim().to_string());
    (text, rendered)
}

fn bench(c: &mut Criterion) {
    let rendered = format!("Bearer {SECRET}");
    let redactor = Redactor::new(SECRET.as_bytes(), &[rendered.as_bytes()]);
    let mut group = c.benchmark_group("build");
    group.bench_function("token", |b| {
        b.iter(|| Redactor::new(SECRET.as_bytes(), &[rendered.as_bytes()]))
    });
    let (text, lines) = key(300);
    let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    group.bench_function("ssh_key", |b| {
        b.iter(|| Redactor::new(text.as_bytes(), &lines))
    });
    group.finish();

    let mut group = c.benchmark_group("scrub");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for (label, size) in [("1MiB", MIB), ("16MiB", 16 * MIB)] {
        for hits in [0usize, 5] {
            let data = body(size, hits);
            let (_, n) = redactor.scrub(&data);
            assert_eq!(n as usize, hits, "{label} with {hits} hits");
            group.throughput(Throughput::Bytes(data.len() as u64));
            group.bench_with_input(
                BenchmarkId::new(label, format!("{hits}_hits")),
                &data,
                |b, data| b.iter(|| redactor.scrub(data)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
