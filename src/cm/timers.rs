//! The agent's timers: a message sent again until answered or out of retries, time wait
//! (IBTA 12.9.8), SIDR retries.

use crate::wire::cm::{RejectReason, RejectedMessage};

use super::agent::*;
use super::msg::Envelope;
use super::types::*;
use super::Instant;

impl CmAgent {
    /// When [`CmAgent::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.deadline);
        let out = self.sidr_out.values().map(|s| s.deadline);
        let inbound = self.sidr_in.values().filter_map(|s| s.deadline);
        let held = self
            .held
            .iter()
            .map(|h| h.arrived + self.config.listen_grace);
        conns.chain(out).chain(inbound).chain(held).min()
    }

    /// Run every timer due at `now`: resends, giving up, time wait ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Requests no listener came for in time: refused now.
        let grace = self.config.listen_grace;
        if self.held.iter().any(|h| h.arrived + grace <= now) {
            let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
                .into_iter()
                .partition(|h| h.arrived + grace <= now);
            self.held = waiting;
            for h in due {
                self.refuse_unlistened(h.from, h.tid, h.msg);
            }
        }
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.conn_timeout(now, id);
        }
        let due: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, s)| s.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(s) = self.sidr_out.get_mut(&id) else {
                continue;
            };
            if s.retries_left == 0 {
                self.sidr_out.remove(&id);
                self.emit(CmEvent::SidrTimeout { sidr: SidrId(id) });
                continue;
            }
            s.retries_left -= 1;
            s.deadline = now + s.timeout;
            let (to, env) = (s.peer, s.env.clone());
            self.stats.retransmits += 1;
            self.send(to, env);
        }
        let expired: Vec<u32> = self
            .sidr_in
            .iter()
            .filter(|(_, s)| s.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(s) = self.sidr_in.remove(&id) {
                self.sidr_in_by_request.remove(&(s.peer.gid, s.request_id));
            }
        }
    }

    pub(super) fn conn_timeout(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state == State::TimeWait {
            // Emitted first: `remove` forgets whether the user abandoned it.
            self.emit(CmEvent::TimewaitExit { conn: ConnId(id) });
            self.remove(id);
            return;
        }
        let Some(pending) = c.pending.as_mut() else {
            c.deadline = None;
            return;
        };
        if pending.retries_left > 0 {
            pending.retries_left -= 1;
            c.deadline = Some(now + c.response_timeout);
            let (to, env) = (c.peer, pending.env.clone());
            self.stats.retransmits += 1;
            self.send(to, env);
            return;
        }
        // Out of retries (IBTA 12.9.5: REJ "timeout" on giving up on REQ or REP).
        let conn = ConnId(id);
        match c.state {
            State::ReqSent | State::MraReqRcvd | State::RepSent | State::MraRepRcvd => {
                let passive = matches!(c.state, State::RepSent | State::MraRepRcvd);
                self.send_timeout_rej(id);
                self.emit(CmEvent::Timeout { conn });
                if passive {
                    self.enter_time_wait(now, id);
                } else {
                    self.remove(id);
                }
            }
            State::DreqSent => {
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: Vec::new(),
                    timed_out: true,
                });
            }
            _ => {
                c.pending = None;
                c.deadline = None;
            }
        }
    }

    /// REJ "timeout", its ARI our CA GUID (IBTA 12.6.7.2, table 112).
    pub(super) fn send_timeout_rej(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let env = Envelope {
            tid: c.tid,
            msg: agent_rej(
                id,
                c.remote_comm_id,
                RejectedMessage::Other,
                RejectReason::Timeout,
                &self.config.local_ca_guid.to_be_bytes(),
            ),
        };
        let to = c.peer;
        self.send(to, env);
    }

    /// The connection waits out its packets' lifetime before its comm id is free again.
    /// Its peer's QPN is free at once, as Linux's CM frees it (cm_enter_timewait): the peer
    /// may connect that QP anew (a restarted program gets the same QPN), while a REQ of
    /// the old connection (its comm id, kept in `by_remote_id`) still gets REJ "stale
    /// connection" (IBTA 12.9.8.3).
    pub(super) fn enter_time_wait(&mut self, now: Instant, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.pending = None;
            c.answer = None;
            c.deadline = Some(now + c.time_wait);
            let key = (c.remote_ca_guid, c.remote_qpn);
            if self.by_remote_qpn.get(&key) == Some(&id) {
                self.by_remote_qpn.remove(&key);
            }
        }
    }
}
