//! The pieces of `xroce conform` (issue 16), the RoCE conformance suite: a target agent that
//! runs on the host of the stack under test and drives it through pyverbs
//! ([`AGENT_PY`], `src/conform/agent.py`), and [`AgentClient`], the peer's side of its
//! protocol. The scripted peer and the case catalogue build on these.

mod agent;

pub use agent::{AgentClient, AgentError, Completion, ConnectParams, Hello, MrInfo, QpInfo};

/// The target agent (Python 3 with pyverbs), as shipped: copy it to the target host.
pub const AGENT_PY: &str = include_str!("agent.py");
