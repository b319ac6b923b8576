//! The agent side cannot approve, read a secret, read the audit log or change the
//! configuration: what the MCP server and the daemon's agent socket hold is an
//! [`postern_broker::AgentApi`], and each of those is a compile error through it. Every
//! case in `agent_boundary/` tries one and must fail to compile with the error recorded
//! beside it; `agent_boundary/allowed.rs` uses what the agent side may do and must
//! compile, so the cases fail for the reason they name, not for a broken harness.

#[test]
fn the_agent_side_cannot_reach_what_only_the_operator_may() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/agent_boundary/allowed.rs");
    cases.compile_fail("tests/agent_boundary/cannot_*.rs");
}
