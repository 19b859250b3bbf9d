//! The InfiniBand communication manager's protocol (IBTA chapter 12) as a sans-IO state
//! machine, in the style of the engine: time is an argument, nothing here reads a clock or
//! touches a socket or a QP.
//!
//! One [`CmAgent`] serves one port (GID). The caller feeds it the CM MADs that arrive on QP1
//! ([`CmAgent::handle_mad`]), sends what [`CmAgent::poll_transmit`] hands out, runs
//! [`CmAgent::handle_timeout`] at [`CmAgent::poll_timeout`], and reads [`CmEvent`]s from
//! [`CmAgent::poll_event`]. The agent knows nothing about QPs: the caller (the rdma_cm layer)
//! moves its QPs through INIT/RTR/RTS from the events' contents, then answers with
//! [`CmAgent::accept`], [`CmAgent::send_rtu`], [`CmAgent::reject`], [`CmAgent::disconnect`].
//!
//! The states, timers and rules are described in docs/cm.md, "The state machine".
//!
//! Every connection is named by its local communication id ([`ConnId`]); an id is not handed
//! out again while a connection holds it, time wait included (IBTA 12.9.8.3).

//! Rooms: `types` (the values the caller and the agent exchange: ids, requests, replies,
//! events, errors, counters); `msg` (a message with its transaction id); `agent` (the
//! [`CmAgent`], its connections, listeners and SIDR exchanges, and what every handler needs:
//! allocation, sending, events); over it, one room per kind of work on the agent:
//! `commands` (the caller's calls: connect, accept, reject, disconnect, SIDR), `handlers`
//! (a MAD that arrived, one handler per message) and `timers` (retries, time wait).

mod agent;
mod commands;
mod handlers;
mod msg;
#[cfg(test)]
mod tests;
mod timers;
mod types;

pub use crate::engine::Instant;
pub use crate::wire::cm::{CmRep, CmReq, PathMtu, RejectReason, SidrStatus, TransportType};
pub use agent::CmAgent;
pub use types::*;
