import type {
  ActivityPage,
  ActivityRow,
  AgentCard,
  ApprovalCard,
  ApprovalProof,
  CredentialCard,
  IntegrityState,
  InvocationDetail,
  Overview,
  RecordedAgent,
} from "../lib/bindings";

export const FINGERPRINT = "f1e2d3c4b5a697887766554433221100aabbccddeeff00112233445566778899";

export function agent(overrides: Partial<AgentCard> = {}): AgentCard {
  return {
    session: "sess-1",
    agent: { pid: 4242, executable: "/usr/bin/claude", claimed_command: "claude --mcp", cwd: "/home/ada/project" },
    parent_chain: [
      { pid: 4100, executable: "/usr/bin/zsh", claimed_command: "zsh", cwd: "/home/ada" },
      { pid: 1, executable: "/sbin/init", claimed_command: "init", cwd: "/" },
    ],
    first_seen_ms: Date.now() - 192_000,
    ended_at_ms: null,
    connections: 1,
    confinement: "none",
    ...overrides,
  };
}

export const EXE_BLAKE3 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
export const CARD_DIGEST = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

/** An agent as its SESSION_OPENED record describes it. */
export function recordedAgent(overrides: Partial<RecordedAgent> = {}): RecordedAgent {
  return {
    session: "sess-1",
    pid: 4242,
    uid: 1000,
    user_name: "ada",
    executable: "/usr/bin/claude",
    executable_blake3: EXE_BLAKE3,
    executable_verified: true,
    executable_unreadable: null,
    reported_by_bridge: null,
    started_at_ms: Date.now() - 600_000,
    cwd: "/home/ada/project",
    parent_chain: [
      { pid: 4100, executable: "/usr/bin/zsh" },
      { pid: 1, executable: "/sbin/init" },
    ],
    confinement: "none",
    ...overrides,
  };
}

export function approvalProof(overrides: Partial<ApprovalProof> = {}): ApprovalProof {
  return {
    mode: "per_call",
    card_digest: CARD_DIGEST,
    card_intact: true,
    answer: "granted",
    answered_by: "console:ada",
    answered_card_digest: CARD_DIGEST,
    matched: true,
    ...overrides,
  };
}

export function approvalCard(overrides: Partial<ApprovalCard> = {}): ApprovalCard {
  return {
    invocation_id: "inv-1",
    mode: "per_call",
    target: "orders-api",
    summary: "POST https://api.example.com/orders",
    method: "POST",
    url: "https://api.example.com/orders?limit=5",
    body: {
      size: 2048,
      digest: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
      text: '{"item":"<script>alert(1)</script>"}',
      truncated: true,
    },
    ssh_destination: null,
    command: null,
    host_key: null,
    resolved: null,
    proxy: null,
    cautions: [],
    covers: "this request: one send, and at most 2 resends of exactly these bytes",
    headers: [],
    added: [],
    stdin: null,
    credential_id: "orders-token",
    credential_version: "cv-77aa88bb99cc",
    injection_mode: "bearer_header",
    idempotency_key: "idem-123",
    fingerprint: FINGERPRINT,
    requested_at_ms: Date.now() - 5_000,
    expires_at_ms: Date.now() + 120_000,
    agent: agent(),
    recorded_agent: recordedAgent(),
    card_digest: CARD_DIGEST,
    ...overrides,
  };
}

export function row(n: number, overrides: Partial<ActivityRow> = {}): ActivityRow {
  return {
    id: `inv-${n}`,
    accepted_seq: n,
    accepted_at_ms: 1_700_000_000_000 + n * 1000,
    session: "sess-1",
    target: "orders-api",
    summary: `GET https://api.example.com/orders/${n}`,
    phase: "result_delivery",
    outcome: "committed",
    retry: "never",
    code: null,
    ...overrides,
  };
}

/** Rows `from` down to `from - count + 1`, newest first, as the journal pages them. */
export function page(from: number, count: number, next: number | null): ActivityPage {
  const rows: ActivityRow[] = [];
  for (let n = from; n > from - count; n--) rows.push(row(n));
  return { rows, next_before_seq: next, took_us: 1234 };
}

export function detail(id: string, overrides: Partial<InvocationDetail> = {}): InvocationDetail {
  return {
    row: row(7, { id, outcome: "unknown", phase: "remote_execution", retry: "reconcile", code: "REMOTE_OUTCOME_UNKNOWN" }),
    events: [
      { seq: 10, at_ms: 1_700_000_000_000, kind: "INVOCATION_ACCEPTED", step: "accepted", detail: "accepted" },
      { seq: 11, at_ms: 1_700_000_000_100, kind: "VALIDATED", step: "validated", detail: "valid" },
      { seq: 12, at_ms: 1_700_000_000_200, kind: "DISPATCH_STARTED", step: "dispatched", detail: "sent" },
      { seq: 13, at_ms: 1_700_000_000_300, kind: "OUTCOME_UNKNOWN", step: "failed", detail: "connection reset" },
    ],
    envelope: { status: "failed", error: { code: "REMOTE_OUTCOME_UNKNOWN" } },
    proves: ["The request was sent to api.example.com."],
    does_not_prove: ["That the remote applied it."],
    manifest_verdict: null,
    can_query: false,
    unsettled: true,
    settlement: null,
    agent: null,
    approval: null,
    related: [],
    job: null,
    members: [],
    ...overrides,
  };
}

export function credential(id: string, overrides: Partial<CredentialCard> = {}): CredentialCard {
  return {
    id,
    kind: "token",
    version: "v-0123456789abcdef",
    created_at_ms: 1_700_000_000_000,
    rotated_at_ms: null,
    last_used_ms: null,
    used_by: ["orders-api"],
    ...overrides,
  };
}

export function overview(overrides: Partial<Overview> = {}): Overview {
  return {
    vault_empty: false,
    credentials: 1,
    targets: 1,
    pending_approvals: 0,
    needs_reconciliation: 0,
    data_dir: "/home/ada/.local/share/postern",
    config_path: "/home/ada/.config/postern/postern.toml",
    socket: "/run/user/1000/postern.sock",
    bridge_command: "/opt/postern/bin/postern",
    keychain: "secret-service",
    mode: "single_user",
    operator_refusals: 0,
    unconfined_sessions: 0,
    confined_sessions: 0,
    last_seq: 0,
    result_store_failures: 0,
    result_store_failure_latest: null,
    agents_paused: false,
    ...overrides,
  };
}

export function integrity(overrides: Partial<IntegrityState> = {}): IntegrityState {
  return {
    state: "verified",
    through_seq: 1234,
    checked_at_ms: 1_700_000_000_000,
    events: 1234,
    checkpoints: 12,
    failure: null,
    first_bad_seq: null,
    unsigned_events: 0,
    notes: [],
    scope: "full",
    witnesses: 0,
    assurance:
      "signed with a key in the user's keychain, which any process of that user could read and re-sign with; no witness's cosignature was checked: whoever holds the signing key could rewrite the journal and re-sign it",
    ...overrides,
  };
}
