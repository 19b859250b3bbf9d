//! `xroce conform` (issue 16), the RoCE conformance suite: a scripted [`Peer`] that sends
//! frames it composes itself over AF_XDP and records what comes back; a target agent that
//! runs on the host of the stack under test and drives it through pyverbs ([`AGENT_PY`],
//! `tools/src/conform/agent.py`) with [`AgentClient`] on this side; the [`catalogue`] of cases, each
//! citing the IBTA rule it checks; and the results ([`report`]): verdicts held against a
//! target's [`Expectations`], the terminal table, JSON and an HTML report with a ladder
//! diagram per case.

mod agent;
pub mod case;
pub mod catalogue;
pub mod peer;
pub mod report;

pub use agent::{
    AgentClient, AgentError, Completion, ConnectParams, Hello, MrInfo, QpInfo, TargetCounters,
};
pub use case::{Case, CaseError, Check, Ctx, Rc, Verdict, Windows};
pub use catalogue::catalogue;
pub use peer::{Direction, Endpoint, Heard, Peer, PeerError, Record};
pub use report::{CaseResult, Expectations};

/// The target agent (Python 3 with pyverbs), as shipped: copy it to the target host.
pub const AGENT_PY: &str = include_str!("agent.py");
