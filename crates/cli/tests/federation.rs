//! Federation between two real brokers (issue 14, seed 002): broker A and broker B are
//! separate `postern daemon` processes with their own data dirs, keychain services and
//! keys, on 127.0.0.1. An agent calls `peer/org-b/payments` through A's bridge; A calls
//! B's peering port through a relay that counts every `peer_call` and can stand in for
//! a rate limiter or for an attacker on the path; B holds the credential and calls the
//! origin. Each case checks what the agent was told, what both journals recorded, how
//! many requests crossed between the brokers (no retry storms), and how often the origin
//! was reached (never twice).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use postern_console::operator::OperatorClient;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, Agent, is_error, structured};
use postern_tests::disk::{Tmpfs, fill};
use postern_tests::files_containing;
use postern_tests::relay::{Relay, RelayMode};

mod support;

use support::peers::peering_addr;
use support::{Daemon, POSTERN, SECRET};

const PEER_CALL: &str = "peer_call";
const PEER_RECONCILE: &str = "peer_reconcile";

/// How A calls B: its `[[peer]]` settings beyond name, key and URL.
struct Budgets {
    timeout_ms: u64,
    transient_retries: u32,
    unknown_retries: u32,
    backoff_ms: u64,
    max_backoff_ms: u64,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            timeout_ms: 20_000,
            transient_retries: 5,
            unknown_retries: 2,
            backoff_ms: 20,
            max_backoff_ms: 80,
        }
    }
}

/// Two brokers and the agent of the first: A (asks) → relay → B (holds the credential)
/// → origin. Dropped in this order: the agent, A, B, then the relay and the origin.
struct Pair {
    agent: Agent,
    a: Daemon,
    b: Daemon,
    relay: Relay,
    origin: Adversary,
}

/// B's targets: `payments` (exported to A; reconciled with `GET /lookup`) and, under
/// it, `payments-admin`, which is not exported: a call to `payments` whose path lands
/// in it is refused by B's policy.
fn b_config(origin: &str, approval: &str, a_key: &str) -> String {
    format!(
        r#"
[[http]]
name = "payments"
base_url = "{origin}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "{approval}"
idempotent_methods = ["GET"]
timeout_ms = 10000

[http.reconcile]
method = "GET"
path = "/lookup"
committed_status = [200]
not_applied_status = [404]

[[http]]
name = "payments-admin"
base_url = "{origin}/v1/admin"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"

[[peer]]
name = "org-a"
key = "{a_key}"
exports = ["payments"]
"#
    )
}

fn a_config(b_key: &str, url: &str, budgets: &Budgets) -> String {
    let Budgets {
        timeout_ms,
        transient_retries,
        unknown_retries,
        backoff_ms,
        max_backoff_ms,
    } = budgets;
    format!(
        r#"
[[peer]]
name = "org-b"
key = "{b_key}"
url = "{url}"
timeout_ms = {timeout_ms}
transient_retries = {transient_retries}
unknown_retries = {unknown_retries}
backoff_ms = {backoff_ms}
max_backoff_ms = {max_backoff_ms}
"#
    )
}

impl Pair {
    /// The brokers as their operators would set them up: A runs first (its key is
    /// what B pins), B pins A and serves peers, then A is configured with B's key and
    /// (through the relay) B's URL.
    async fn start(origin: Behavior, approval: &str, budgets: Budgets) -> Pair {
        Self::start_with_b_dir(origin, approval, budgets, tempfile::tempdir().unwrap()).await
    }

    async fn start_with_b_dir(
        origin: Behavior,
        approval: &str,
        budgets: Budgets,
        b_dir: tempfile::TempDir,
    ) -> Pair {
        let origin = Adversary::start(origin).await.unwrap();
        let mut a = support::start_daemon_args("", &[]);
        let b = support::start_daemon_dir_args(
            b_dir,
            &b_config(&origin.base_url(), approval, &a.audit_key()),
            &["--peer-listen", "127.0.0.1:0"],
        );
        let relay = Relay::start(peering_addr(&b)).await.unwrap();
        a.reconfigure(&a_config(&b.audit_key(), &relay.url(), &budgets));
        let agent = agent::connect(Path::new(POSTERN), &a.socket).await.unwrap();
        Pair {
            agent,
            a,
            b,
            relay,
            origin,
        }
    }

    /// The agent's `http_request` to `peer://org-b/payments{path}`: the answer's
    /// structured content, checked for the canary.
    async fn call(&self, method: &str, path: &str, body: &str) -> Value {
        call_peer(&self.agent, method, path, body).await
    }

    /// [`Pair::call`] of `POST {path}` on a task of its own, for a test that acts while
    /// the call is in flight.
    fn spawn_call(&self, path: &str, body: &str) -> tokio::task::JoinHandle<Value> {
        let (agent, path, body) = (
            self.agent.peer().clone(),
            path.to_string(),
            body.to_string(),
        );
        tokio::spawn(async move { call_peer(&agent, "POST", &path, &body).await })
    }

    /// The `verdict` of each PEER_ANSWER A recorded for `invocation`, in order.
    fn verdicts(&self, invocation: &str) -> Vec<String> {
        events(&self.a, invocation, "PEER_ANSWER")
            .iter()
            .map(|body| find(body, "verdict").as_str().unwrap().to_string())
            .collect()
    }

    /// A's incidents, as `postern operator incidents` prints them.
    fn incidents(&self) -> Vec<Value> {
        self.a.operator(&["incidents"]).as_array().cloned().unwrap()
    }

    /// A call B holds as unavailable (its log says `why`) until `release`: B signs
    /// `unavailable`, the origin sees nothing meanwhile, and after the release the same
    /// call commits, run once at the origin, with no incident.
    async fn held_until_released(&self, why: &str, release: impl FnOnce()) {
        let call = self.spawn_call("/charges", "{}");
        wait_until("B's signed unavailable", Duration::from_secs(20), || {
            self.relay.calls(PEER_CALL) >= 2
        })
        .await;
        assert!(self.b.stderr().contains(why), "{}", self.b.stderr());
        assert_eq!(self.origin.requests().len(), 0);
        release();

        let answer = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer["outcome"], "committed", "{answer}");
        let verdicts = self.verdicts(&invocation(&answer));
        // The call the relay counted last may reach B after the release.
        assert!(verdicts.len() >= 2, "{verdicts:?}");
        assert!(
            verdicts[..verdicts.len() - 1]
                .iter()
                .all(|v| v == "unavailable"),
            "{verdicts:?}"
        );
        assert_eq!(verdicts.last().unwrap(), "outcome");
        assert_eq!(self.origin.effects(), 1);
        assert!(self.incidents().is_empty());
    }

    /// Neither broker's files, nor anything the agent was told, hold the credential.
    fn assert_no_canary(&self, answers: &[&Value]) {
        for answer in answers {
            assert!(!answer.to_string().contains(SECRET), "{answer}");
        }
        for dir in [self.a.dir.path(), self.b.dir.path()] {
            let found = files_containing(dir, SECRET.as_bytes());
            assert!(found.is_empty(), "the credential reached {found:?}");
        }
        assert!(!self.a.stderr().contains(SECRET));
        assert!(!self.b.stderr().contains(SECRET));
    }
}

async fn call_peer(
    agent: &rmcp::Peer<rmcp::service::RoleClient>,
    method: &str,
    path: &str,
    body: &str,
) -> Value {
    let mut args = json!({"url": format!("peer://org-b/payments{path}"), "method": method});
    if !body.is_empty() {
        args["body"] = json!(body);
    }
    let result = agent::call(agent, "http_request", args).await.unwrap();
    let value = structured(&result);
    assert_eq!(is_error(&result), value.get("error").is_some(), "{value}");
    assert!(!value.to_string().contains(SECRET), "{value}");
    value
}

/// Budgets that outlast B being unavailable for a while.
fn patient() -> Budgets {
    Budgets {
        transient_retries: 20,
        backoff_ms: 100,
        max_backoff_ms: 200,
        ..Budgets::default()
    }
}

fn operator_socket(daemon: &Daemon) -> std::path::PathBuf {
    daemon.dir.path().join("run").join("operator.sock")
}

/// The bodies of `invocation`'s events of `kind` in `daemon`'s journal, in order.
fn events(daemon: &Daemon, invocation: &str, kind: &str) -> Vec<Value> {
    let journal = daemon.journal();
    let mut statement = journal
        .prepare("SELECT body FROM events WHERE invocation_id = ?1 AND kind = ?2 ORDER BY seq")
        .unwrap();
    statement
        .query_map([invocation, kind], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|body| serde_json::from_str(&body.unwrap()).unwrap())
        .collect()
}

/// The first value of field `key` anywhere in `value`.
fn find<'v>(value: &'v Value, key: &str) -> &'v Value {
    fn walk<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
        match value {
            Value::Object(map) => map
                .get(key)
                .or_else(|| map.values().find_map(|v| walk(v, key))),
            Value::Array(items) => items.iter().find_map(|v| walk(v, key)),
            _ => None,
        }
    }
    walk(value, key).unwrap_or_else(|| panic!("no `{key}` in {value}"))
}

/// The invocation an answer is about.
fn invocation(answer: &Value) -> String {
    find(answer, "invocation_id").as_str().unwrap().to_string()
}

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or("")
}

async fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_runs_once_on_b_and_both_journals_record_the_signed_outcome() {
    let p = Pair::start(
        Behavior::respond(201, r#"{"charge":"ch_1"}"#),
        "none",
        Budgets::default(),
    )
    .await;

    let listed = agent::call(&p.agent, "list_targets", json!({}))
        .await
        .unwrap();
    let listed = structured(&listed);
    let names: Vec<&str> = listed["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, vec!["peer/org-b/payments"], "only what B exports");

    let answer = p.call("POST", "/charges", r#"{"amount":5}"#).await;
    assert_eq!(answer["outcome"], "committed", "{answer}");
    assert_eq!(answer["status"], 201);
    assert_eq!(answer["body"], r#"{"charge":"ch_1"}"#);
    let id = &invocation(&answer);

    // The origin was reached once, by B, with B's credential.
    assert_eq!(p.origin.effects(), 1);
    let seen = p.origin.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path(), "/v1/charges");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(p.relay.calls(PEER_CALL), 1);

    // A recorded B's signed, verified answer, naming B's invocation...
    assert_eq!(p.verdicts(id), vec!["outcome"]);
    let recorded = &events(&p.a, id, "PEER_ANSWER")[0];
    assert_eq!(find(recorded, "signature"), "verified");
    let b_invocation = find(recorded, "peer_invocation").as_str().unwrap();
    // ...which B's own journal holds, committed, under A's peer session.
    let committed = events(&p.b, b_invocation, "RESULT_COMMITTED");
    assert_eq!(committed.len(), 1, "B's record of the call");
    let session: String =
        p.b.journal()
            .query_row(
                "SELECT session_id FROM invocations WHERE id = ?1",
                [b_invocation],
                |r| r.get(0),
            )
            .unwrap();
    assert!(session.starts_with("peer:"), "{session}");
    assert!(events(&p.a, id, "CREDENTIAL_AUTHORIZED").is_empty());
    p.assert_no_canary(&[&answer, &listed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_by_b_is_terminal_after_exactly_one_request_and_a_policy_incident() {
    let p = Pair::start(Behavior::ok_json("{}"), "none", Budgets::default()).await;

    // `/admin/...` lands in B's `payments-admin`, which B does not export to A.
    let answer = p.call("POST", "/admin/rotate", "{}").await;
    assert_eq!(code(&answer), "PEER_DENIED", "{answer}");
    assert_eq!(answer["error"]["outcome"], "not_attempted");
    assert_eq!(answer["error"]["retry"], "never");
    let id = invocation(&answer);
    assert_eq!(p.relay.calls(PEER_CALL), 1, "a denial is never retried");
    assert_eq!(p.verdicts(&id), vec!["denial"]);
    assert_eq!(p.origin.requests().len(), 0);

    let incidents = p.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0]["kind"], "policy");
    assert_eq!(incidents[0]["owner"], "peering_owner");
    assert_eq!(incidents[0]["signature"], "verified");
    assert_eq!(incidents[0]["code"], "PEER_DENIED");

    // The agent asking again is a new request: one more, and still no storm.
    let again = p.call("POST", "/admin/rotate", "{}").await;
    assert_eq!(code(&again), "PEER_DENIED");
    assert_eq!(p.relay.calls(PEER_CALL), 2);
    assert_eq!(p.origin.requests().len(), 0);
    p.assert_no_canary(&[&answer, &again]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_whose_signature_is_forged_or_stripped_on_the_path_is_unknown_never_a_denial() {
    let p = Pair::start(Behavior::ok_json("{}"), "none", Budgets::default()).await;

    for (mode, signature) in [
        (RelayMode::ForgeSignature, "failed"),
        (RelayMode::StripSignature, "absent"),
    ] {
        p.relay.set_mode(mode);
        let before = p.relay.calls(PEER_CALL);
        let answer = p.call("POST", "/admin/rotate", "{}").await;
        assert_eq!(
            code(&answer),
            "PEER_CONTRACT_VIOLATION",
            "{mode:?}: {answer}"
        );
        assert_ne!(answer["error"]["retry"], "never");
        let id = invocation(&answer);
        // The first answer and the two retries the unknown budget allows.
        assert_eq!(p.relay.calls(PEER_CALL) - before, 3, "{mode:?}");
        assert_eq!(p.verdicts(&id), vec!["unknown"; 3], "{mode:?}");
        let incident = p
            .incidents()
            .into_iter()
            .find(|i| i["invocation_id"] == id.as_str())
            .unwrap();
        assert_eq!(incident["kind"], "contract_violation");
        assert_eq!(incident["owner"], "peer_operator");
        assert_eq!(incident["signature"], signature, "{mode:?}");
    }
    assert!(p.relay.altered() >= 6);
    assert!(
        p.incidents().iter().all(|i| i["kind"] != "policy"),
        "an unverified denial never raises a policy incident"
    );
    assert_eq!(p.origin.requests().len(), 0);
}

/// How many calls of `asker` B's journal records (its `peer_calls` rows).
fn b_calls(p: &Pair) -> i64 {
    p.b.journal()
        .query_row("SELECT count(*) FROM peer_calls", [], |r| r.get(0))
        .unwrap()
}

// Regression: issue 27 (item 1). B's signed outcome for one call, replayed by the relay
// as the answer to a new call with the same content, was accepted: the new call was
// recorded committed, naming B's invocation of the first, while B never heard of it
// and the origin was never reached. Every answer now names the call it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_answer_replayed_for_a_new_call_with_the_same_content_is_never_committed() {
    let p = Pair::start(
        Behavior::ok_json(r#"{"paid":true}"#),
        "none",
        Budgets::default(),
    )
    .await;
    p.relay.set_mode(RelayMode::ReplayFirstAnswer);
    let first = p.call("POST", "/charges", r#"{"amount":5}"#).await;
    assert_eq!(first["outcome"], "committed", "{first}");
    let second = p.call("POST", "/charges", r#"{"amount":5}"#).await;
    assert_ne!(second["outcome"], "committed", "{second}");
    assert!(second["result"].is_null(), "{second}");
    assert_eq!(second["error"]["outcome"], "unknown", "{second}");
    assert_eq!(code(&second), "PEER_CONTRACT_VIOLATION", "{second}");
    assert_eq!(second["error"]["retry"], "reconcile", "{second}");
    let id = invocation(&second);
    assert_eq!(p.verdicts(&id), vec!["unknown"; 3]);
    for answer in events(&p.a, &id, "PEER_ANSWER") {
        assert!(
            find(&answer, "reason")
                .as_str()
                .unwrap()
                .contains("another call"),
            "{answer}"
        );
    }
    assert!(p.relay.altered() >= 3);
    assert_eq!(b_calls(&p), 1, "B never heard of the second call");
    assert_eq!(p.origin.effects(), 1);
}

// Regression: issue 27 (item 2). The relay rewrote `policy_version` on the first try, so
// B signed a genuine `unavailable` for it; on every retry it swapped B's committed
// outcome for that `unavailable`. A ended PEER_NOT_RUN / not_attempted / backoff while B
// had run the call and the origin was charged. The asker's signature now covers the
// policy version, and every answer names its call: never not_attempted here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_kept_from_a_changed_first_try_never_makes_an_executed_call_look_not_run() {
    let p = Pair::start(
        Behavior::ok_json(r#"{"paid":true}"#),
        "none",
        Budgets::default(),
    )
    .await;
    // A knows B's policy (a verified listing) before the call, as it usually does.
    let _ = p.agent.peer().list_tools(None).await;
    p.relay.set_mode(RelayMode::RewritePolicyThenSwap);
    let answer = p.call("POST", "/charges", r#"{"amount":7}"#).await;
    assert_ne!(answer["error"]["outcome"], "not_attempted", "{answer}");
    assert_eq!(answer["error"]["outcome"], "unknown", "{answer}");
    assert_eq!(code(&answer), "PEER_CONTRACT_VIOLATION", "{answer}");
    assert_eq!(answer["error"]["retry"], "reconcile", "{answer}");
    // B ran it once; what B recorded and what the origin saw agree.
    assert_eq!(p.origin.effects(), 1);
    assert_eq!(b_calls(&p), 1);
    let b_invocation: String =
        p.b.journal()
            .query_row("SELECT invocation_id FROM peer_calls", [], |r| r.get(0))
            .unwrap();
    assert_eq!(events(&p.b, &b_invocation, "RESULT_COMMITTED").len(), 1);
    assert!(
        p.incidents()
            .iter()
            .all(|i| i["kind"] != "transient_exhaustion")
    );
}

// Regression: issue 27 (item 3). With no policy version known (the listing answered 503
// by the relay), the relay renamed the caller, B signed its "not authenticated" denial
// (policy `none`), and A recorded PEER_DENIED, retry never, and a policy incident, for
// a capability B exports. Such a denial is unknown and a contract violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_provoked_by_renaming_the_caller_without_a_known_policy_is_never_terminal() {
    let p = Pair::start(Behavior::ok_json("{}"), "none", Budgets::default()).await;
    p.relay.set_mode(RelayMode::FailListingRenameCaller);
    let answer = p.call("POST", "/charges", "{}").await;
    assert_ne!(code(&answer), "PEER_DENIED", "{answer}");
    assert_ne!(answer["error"]["retry"], "never", "{answer}");
    assert_eq!(code(&answer), "PEER_CONTRACT_VIOLATION", "{answer}");
    let id = invocation(&answer);
    assert_eq!(p.verdicts(&id), vec!["unknown"; 3]);
    let incidents = p.incidents();
    assert!(
        incidents.iter().all(|i| i["kind"] != "policy"),
        "{incidents:?}"
    );
    assert!(
        incidents
            .iter()
            .any(|i| i["invocation_id"] == id.as_str() && i["kind"] == "contract_violation"),
        "{incidents:?}"
    );
    assert_eq!(p.origin.requests().len(), 0);
}

// Issue 27 (item 4): B takes a body above 64 KiB only from a session that names a
// pinned peer in `Postern-Peer`; A names itself on every request, so a large call
// goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_a_large_body_goes_through_the_guarded_peering_port() {
    let p = Pair::start(
        Behavior::ok_json(r#"{"ok":true}"#),
        "none",
        Budgets::default(),
    )
    .await;
    let body = format!(r#"{{"blob":"{}"}}"#, "x".repeat(200 * 1024));
    let answer = p.call("POST", "/uploads", &body).await;
    assert_eq!(answer["outcome"], "committed", "{answer}");
    assert_eq!(p.origin.effects(), 1);
    assert_eq!(p.relay.calls(PEER_CALL), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_answering_429_is_transient_and_never_turns_into_a_denial() {
    let p = Pair::start(
        Behavior::respond(201, "{}"),
        "none",
        Budgets {
            transient_retries: 12,
            ..Budgets::default()
        },
    )
    .await;

    let first = p.call("POST", "/charges", r#"{"n":1}"#).await;
    assert_eq!(first["outcome"], "committed", "{first}");

    // After one call, the limiter answers the next ten itself.
    p.relay.set_mode(RelayMode::RateLimit {
        tool: PEER_CALL,
        after: 1,
        answers: 10,
    });
    let limited = p.call("POST", "/charges", r#"{"n":2}"#).await;
    assert_eq!(limited["outcome"], "committed", "{limited}");
    assert_eq!(p.relay.limited(), 10);
    assert_eq!(p.relay.calls(PEER_CALL), 12);
    let id = &invocation(&limited);
    let verdicts = p.verdicts(id);
    assert_eq!(verdicts.len(), 11);
    assert!(
        verdicts[..10].iter().all(|v| v == "transport"),
        "{verdicts:?}"
    );
    assert_eq!(verdicts[10], "outcome");
    assert_eq!(p.origin.effects(), 2, "each call ran once");

    // A limiter that never lets up spends the transient budget: unavailable, the
    // local operator's incident, and still never a denial.
    p.relay.set_mode(RelayMode::RateLimit {
        tool: PEER_CALL,
        after: 0,
        answers: 1000,
    });
    let exhausted = p.call("POST", "/charges", r#"{"n":3}"#).await;
    assert_eq!(code(&exhausted), "PEER_UNAVAILABLE", "{exhausted}");
    assert_eq!(p.relay.limited(), 13, "the first try and twelve retries");
    let incidents = p.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0]["kind"], "transient_exhaustion");
    assert_eq!(incidents[0]["owner"], "local_operator");
    assert_eq!(p.origin.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_unavailable_with_a_full_disk_then_recovered_runs_the_call_once() {
    let Some(disk) = Tmpfs::mount("32m") else {
        return;
    };
    let b_dir = tempfile::tempdir_in(disk.path()).unwrap();
    let filler = disk.path().join("filler");
    let p = Pair::start_with_b_dir(Behavior::respond(201, "{}"), "none", patient(), b_dir).await;
    fill(&filler).unwrap();
    p.held_until_released("the journal cannot record the call", || {
        std::fs::remove_file(&filler).unwrap()
    })
    .await;
    drop(p);
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_s_operator_pausing_agents_holds_a_s_call_as_unavailable_until_they_resume() {
    let p = Pair::start(Behavior::respond(201, "{}"), "none", patient()).await;
    p.b.operator(&["pause"]);
    p.held_until_released("the operator paused agent calls", || {
        p.b.operator(&["resume"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_s_policy_changing_mid_flight_abandons_the_attempt_without_running_it() {
    let p = Pair::start(
        Behavior::respond(201, "{}"),
        "none",
        Budgets {
            backoff_ms: 3_000,
            max_backoff_ms: 3_000,
            ..Budgets::default()
        },
    )
    .await;
    // A lists B's capabilities (and their policy version) before the call.
    agent::call(&p.agent, "list_targets", json!({}))
        .await
        .unwrap();
    // The first try meets a rate limiter, so the attempt is still going when B's
    // operator edits the exported target.
    p.relay.set_mode(RelayMode::RateLimit {
        tool: PEER_CALL,
        after: 0,
        answers: 1,
    });
    let call = p.spawn_call("/charges", "{}");
    wait_until("the first try", Duration::from_secs(20), || {
        p.relay.limited() == 1
    })
    .await;
    let edited = OperatorClient::new(operator_socket(&p.b))
        .call(
            "update_target",
            json!({"edit": {"name": "payments", "toml": b_config(
                &p.origin.base_url(), "none", "unused")
                .split("[[http]]\nname = \"payments-admin\"").next().unwrap()
                .replace("timeout_ms = 10000", "timeout_ms = 9000")
                .trim()
                .to_string()}}),
        )
        .await;
    assert!(edited.is_ok(), "{edited:?}");

    let answer = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&answer), "PEER_POLICY_CHANGED", "{answer}");
    assert_eq!(answer["error"]["outcome"], "not_attempted");
    let id = &invocation(&answer);
    assert_eq!(p.verdicts(id), vec!["transport", "policy_changed"]);
    assert_eq!(p.relay.calls(PEER_CALL), 2);
    assert_eq!(
        p.origin.requests().len(),
        0,
        "nothing ran under the new policy"
    );
    assert!(
        p.incidents().is_empty(),
        "an abandoned attempt is no incident"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_s_approver_denying_a_per_call_card_is_b_s_signed_outcome_not_a_policy_denial() {
    let p = Pair::start(Behavior::ok_json("{}"), "per_call", Budgets::default()).await;
    let call = p.spawn_call("/charges", r#"{"amount":9}"#);
    let operator = OperatorClient::new(operator_socket(&p.b));
    let mut card = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(20);
    while card.is_null() {
        assert!(Instant::now() < deadline, "no approval card on B");
        let cards = operator.call("list_approvals", Value::Null).await.unwrap();
        card = cards
            .as_array()
            .and_then(|c| c.first().cloned())
            .unwrap_or(Value::Null);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        card["summary"]
            .as_str()
            .unwrap()
            .contains("for peer broker org-a"),
        "{card}"
    );
    operator
        .call(
            "answer_approval",
            json!({
                "invocationId": card["invocation_id"],
                "fingerprint": card["fingerprint"],
                "cardDigest": card["card_digest"],
                "decision": "deny",
            }),
        )
        .await
        .unwrap();

    let answer = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&answer), "APPROVAL_DENIED", "{answer}");
    assert_eq!(answer["error"]["outcome"], "not_attempted");
    let id = &invocation(&answer);
    assert_eq!(p.verdicts(id), vec!["outcome"]);
    assert_eq!(p.relay.calls(PEER_CALL), 1);
    assert!(p.incidents().is_empty(), "B's approver is not B's policy");
    assert_eq!(p.origin.requests().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_b_mid_call_leaves_a_unknown_and_b_s_reconciliation_settles_it_once() {
    // The charge stalls after the origin applied it; the next connection is B's
    // reconcile query, which finds it applied.
    let mut p = Pair::start(
        Behavior::Sequence(vec![Behavior::Stall, Behavior::ok_json(r#"{"applied":1}"#)]),
        "none",
        Budgets {
            transient_retries: 20,
            backoff_ms: 100,
            max_backoff_ms: 300,
            ..Budgets::default()
        },
    )
    .await;
    let call = p.spawn_call("/charges", r#"{"amount":7}"#);
    assert!(p.origin.wait_for_effects(1, Duration::from_secs(20)).await);
    // SIGKILL B mid-call, then start it again over the same data dir (a new port).
    p.b.restart();
    p.relay.set_upstream(peering_addr(&p.b)).unwrap();

    let answer = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&answer), "PEER_OUTCOME_UNKNOWN", "{answer}");
    assert_eq!(answer["error"]["outcome"], "unknown");
    assert_eq!(answer["error"]["retry"], "reconcile");
    let id = invocation(&answer);
    assert_eq!(p.origin.effects(), 1, "never sent again");

    // A's operator reconciles: B runs its own query and signs what it proves.
    let reconciled = OperatorClient::new(operator_socket(&p.a))
        .call("run_reconcile_query", json!({"invocationId": id}))
        .await;
    assert!(reconciled.is_ok(), "{reconciled:?}");
    assert_eq!(p.relay.calls(PEER_RECONCILE), 1);
    let seen = p.origin.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].path(), "/v1/lookup");

    let settled = agent::call(&p.agent, "get_invocation", json!({"invocation_id": id}))
        .await
        .unwrap();
    let settled = structured(&settled);
    assert_eq!(find(&settled, "outcome"), "committed", "{settled}");
    let last = events(&p.a, &id, "PEER_ANSWER").pop().unwrap();
    assert_eq!(find(&last, "signature"), "verified");
    assert_eq!(p.origin.effects(), 1);
    p.assert_no_canary(&[&answer, &settled]);
}
