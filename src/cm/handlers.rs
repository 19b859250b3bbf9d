//! A CM MAD that arrived (IBTA 12.6, 12.9): parsed, matched to its connection or listener,
//! and handled, one handler per message.

use crate::wire::cm::{
    CmDrep, CmDreq, CmMessage, CmMra, CmRej, CmRep, CmReq, CmRtu, MraedMessage, PrivateData,
    RejectReason, RejectedMessage, SidrRep, SidrReq, SidrStatus, TransportType, ARI_LEN,
};

use super::agent::*;
use super::msg::Envelope;
use super::types::*;
use super::Instant;

impl CmAgent {
    /// Take a MAD that arrived on QP1 from `from`. Anything that is not a well-formed CM
    /// message, or that no connection takes, is counted in [`CmAgent::stats`] and dropped.
    pub fn handle_mad(&mut self, now: Instant, from: MadPeer, bytes: &[u8]) {
        self.stats.received += 1;
        match Envelope::decode(bytes) {
            Ok(env) => self.handle_message(now, from, env),
            Err(_) => self.stats.dropped_malformed += 1,
        }
    }

    pub(super) fn handle_message(&mut self, now: Instant, from: MadPeer, env: Envelope) {
        let tid = env.tid;
        match env.msg {
            CmMessage::Req(req) => self.on_req(now, from, tid, req),
            CmMessage::Mra(mra) => self.on_mra(now, mra),
            CmMessage::Rej(rej) => self.on_rej(now, rej),
            CmMessage::Rep(rep) => self.on_rep(now, from, tid, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu),
            CmMessage::Dreq(dreq) => self.on_dreq(now, from, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(rep),
            // Alternate paths are not used on RoCE: LAP/APR are dropped (IBTA 12.8 optional).
            CmMessage::Lap(_) | CmMessage::Apr(_) => self.stats.dropped_unsupported += 1,
        }
    }

    /// A REJ for a message no connection of ours owns (the peer's comm id in
    /// `remote_comm_id`, IBTA 12.6.7).
    pub(super) fn reject_unowned(
        &mut self,
        to: MadPeer,
        tid: u64,
        remote_comm_id: u32,
        kind: RejectedMessage,
        reason: RejectReason,
    ) {
        let env = Envelope {
            tid,
            msg: agent_rej(0, remote_comm_id, kind, reason, &[]),
        };
        self.send(to, env);
    }

    /// A request for a service id nobody listens on: held for a listener
    /// ([`CmConfig::listen_grace`]; a duplicate of a held one is dropped), else refused.
    fn hold_or_refuse(&mut self, now: Instant, from: MadPeer, tid: u64, msg: HeldMsg) {
        // Behind a relay (ids prefixed by the slot) a request nobody listens on comes to one
        // slot while the listener may appear in another: refused at once, as Linux does.
        if self.config.listen_grace.is_zero() || self.config.comm_id_prefix.is_some() {
            self.refuse_unlistened(from, tid, msg);
            return;
        }
        let same = |h: &HeldRequest| {
            h.from.gid == from.gid
                && match (&h.msg, &msg) {
                    (HeldMsg::Req(a), HeldMsg::Req(b)) => {
                        (a.local_ca_guid, a.local_comm_id) == (b.local_ca_guid, b.local_comm_id)
                    }
                    (HeldMsg::Sidr(a), HeldMsg::Sidr(b)) => a.request_id == b.request_id,
                    _ => false,
                }
        };
        if self.held.iter().any(same) {
            self.stats.dropped_duplicate += 1;
        } else if self.held.len() < MAX_HELD_REQUESTS {
            self.stats.held_for_listener += 1;
            self.held.push(HeldRequest {
                from,
                tid,
                msg,
                arrived: now,
            });
        } else {
            self.refuse_unlistened(from, tid, msg);
        }
    }

    /// No listener for a request: REJ "invalid service id" (IBTA 12.6.7) for a REQ, SIDR_REP
    /// status 1, "service id not supported" (12.11.2), for a SIDR_REQ.
    pub(super) fn refuse_unlistened(&mut self, from: MadPeer, tid: u64, msg: HeldMsg) {
        match msg {
            HeldMsg::Req(req) => self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidServiceId,
            ),
            HeldMsg::Sidr(req) => {
                let env = Envelope {
                    tid,
                    msg: CmMessage::SidrRep(SidrRep {
                        request_id: req.request_id,
                        status: SidrStatus::Unsupported,
                        service_id: req.service_id,
                        ..SidrRep::default()
                    }),
                };
                self.send(from, env);
            }
        }
    }

    pub(super) fn on_req(&mut self, now: Instant, from: MadPeer, tid: u64, req: CmReq) {
        // A REQ we have seen (IBTA 12.9.7): answer as the connection's state says.
        if let Some(&id) = self
            .by_remote_id
            .get(&(req.local_ca_guid, req.local_comm_id))
        {
            self.duplicate_req(id, from, tid, req.local_comm_id);
            return;
        }
        // A REQ from a QP we still hold a connection with (IBTA 12.9.8.3: stale).
        if self
            .by_remote_qpn
            .contains_key(&(req.local_ca_guid, req.local_qpn))
        {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::StaleConnection,
            );
            return;
        }
        if !matches!(req.transport_type, TransportType::Rc | TransportType::Uc) {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidTransportType,
            );
            return;
        }
        if req.path_mtu.bytes().is_none() {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::InvalidMtu,
            );
            return;
        }
        let Some(listen) = self.find_listener(req.service_id) else {
            self.hold_or_refuse(now, from, tid, HeldMsg::Req(req));
            return;
        };
        if self.conns.len() >= self.config.max_connections {
            self.reject_unowned(
                from,
                tid,
                req.local_comm_id,
                RejectedMessage::Req,
                RejectReason::NoResources,
            );
            return;
        }
        let id = self.alloc_comm_id();
        let response_timeout =
            self.packet_life() * 2 + self.peer_time(req.local_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: from,
                remote_comm_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                tid,
                max_cm_retries: req.max_cm_retries.min(15),
                response_timeout,
                time_wait: self.packet_life() * 2,
                pending: None,
                answer: None,
                deadline: None,
                mra_seen: false,
            },
        );
        self.by_remote_id
            .insert((req.local_ca_guid, req.local_comm_id), id);
        self.by_remote_qpn
            .insert((req.local_ca_guid, req.local_qpn), id);
        self.emit(CmEvent::ReqReceived {
            conn: ConnId(id),
            listen,
            from,
            req,
        });
    }

    pub(super) fn duplicate_req(&mut self, id: u32, from: MadPeer, tid: u64, remote_comm_id: u32) {
        let mra_timeout = self.config.duplicate_req_mra_timeout.min(31);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let resend = match c.state {
            // The user is still deciding: tell the peer to wait (IBTA 12.6.6).
            State::ReqRcvd => {
                let env = Envelope {
                    tid: c.tid,
                    msg: CmMessage::Mra(CmMra {
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        message_mraed: MraedMessage::Req,
                        service_timeout: mra_timeout,
                        private_data: PrivateData::zeroed(),
                    }),
                };
                c.state = State::MraReqSent;
                c.answer = Some(env.clone());
                Some(env)
            }
            State::MraReqSent => c.answer.clone(),
            State::RepSent | State::MraRepRcvd => c.pending.as_ref().map(|p| p.env.clone()),
            State::TimeWait => {
                self.stats.duplicate_answers += 1;
                self.reject_unowned(
                    from,
                    tid,
                    remote_comm_id,
                    RejectedMessage::Req,
                    RejectReason::StaleConnection,
                );
                return;
            }
            _ => None,
        };
        let to = c.peer;
        match resend {
            Some(env) => {
                self.stats.duplicate_answers += 1;
                self.send(to, env);
            }
            None => self.stats.dropped_duplicate += 1,
        }
    }

    /// The connection a message names in its "Remote Communication ID" (ours), if its
    /// "Local Communication ID" is the peer's we know (or we know none yet).
    pub(super) fn lookup(&mut self, our_id: u32, their_id: u32) -> Option<u32> {
        let Some(c) = self.conns.get(&our_id) else {
            self.stats.dropped_unknown_connection += 1;
            return None;
        };
        if c.remote_comm_id != 0 && their_id != 0 && c.remote_comm_id != their_id {
            self.stats.dropped_mismatch += 1;
            return None;
        }
        Some(our_id)
    }

    pub(super) fn on_mra(&mut self, now: Instant, mra: CmMra) {
        let Some(id) = self.lookup(mra.remote_comm_id, mra.local_comm_id) else {
            return;
        };
        let extra = self.peer_time(mra.service_timeout) + self.packet_life();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent | State::MraReqRcvd, MraedMessage::Req) => State::MraReqRcvd,
            (State::RepSent | State::MraRepRcvd, MraedMessage::Rep) => State::MraRepRcvd,
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        };
        c.state = next;
        if c.remote_comm_id == 0 {
            c.remote_comm_id = mra.local_comm_id;
        }
        // IBTA 12.6.6: wait the service timeout more before sending again.
        c.deadline = Some(now + extra);
        if !c.mra_seen {
            c.mra_seen = true;
            self.emit(CmEvent::MraReceived {
                conn: ConnId(id),
                service_timeout: extra - self.packet_life(),
            });
        }
    }

    pub(super) fn on_rej(&mut self, now: Instant, rej: CmRej) {
        let mut our_id = rej.remote_comm_id;
        // A REJ "timeout" from a side that never learnt our comm id (its REQ unanswered)
        // names its own comm id and, in the ARI, its CA GUID (IBTA 12.6.7.2).
        if our_id == 0 && rej.reason == RejectReason::Timeout {
            if let Ok(guid) = <[u8; 8]>::try_from(rej.ari_bytes()) {
                let key = (u64::from_be_bytes(guid), rej.local_comm_id);
                our_id = self.by_remote_id.get(&key).copied().unwrap_or(0);
            }
        }
        let Some(id) = self.lookup(our_id, rej.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let reason = rej.reason;
        let time_wait = match c.state {
            State::ReqSent | State::MraReqRcvd | State::ReqRcvd | State::MraReqSent => {
                reason == RejectReason::StaleConnection
            }
            State::RepSent
            | State::MraRepRcvd
            | State::RepRcvd
            | State::MraRepSent
            | State::DreqSent
            | State::Established => true,
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        };
        self.emit(CmEvent::Rejected {
            conn: ConnId(id),
            reason,
            ari: rej.ari_bytes().to_vec(),
            private_data: rej.private_data.as_bytes().to_vec(),
            from_peer: true,
        });
        if time_wait {
            self.enter_time_wait(now, id);
        } else {
            self.remove(id);
        }
    }

    pub(super) fn on_rep(&mut self, now: Instant, from: MadPeer, tid: u64, rep: CmRep) {
        let Some(c) = self.conns.get(&rep.remote_comm_id) else {
            self.stats.dropped_unknown_connection += 1;
            // IBTA 12.6.7: a REP for no REQ of ours.
            self.reject_unowned(
                from,
                tid,
                rep.local_comm_id,
                RejectedMessage::Rep,
                RejectReason::InvalidCommId,
            );
            return;
        };
        let id = rep.remote_comm_id;
        match c.state {
            State::ReqSent | State::MraReqRcvd => {}
            State::RepRcvd | State::MraRepSent | State::Established
                if c.remote_comm_id != rep.local_comm_id =>
            {
                self.stats.dropped_mismatch += 1;
                return;
            }
            // Our RTU or MRA was lost: send it again.
            State::MraRepSent | State::Established => {
                let (to, answer) = (c.peer, c.answer.clone());
                match answer {
                    Some(env) => {
                        self.stats.duplicate_answers += 1;
                        self.send(to, env);
                    }
                    None => self.stats.dropped_duplicate += 1,
                }
                return;
            }
            State::RepRcvd => {
                self.stats.dropped_duplicate += 1;
                return;
            }
            _ => {
                self.stats.dropped_wrong_state += 1;
                return;
            }
        }
        // A REP from a QP another connection of ours still holds (IBTA 12.9.8.3): stale.
        if let Some(&old) = self
            .by_remote_qpn
            .get(&(rep.local_ca_guid, rep.local_qpn))
            .filter(|&&old| old != id)
        {
            let c = &self.conns[&id];
            let env = Envelope {
                tid: c.tid,
                msg: agent_rej(
                    id,
                    rep.local_comm_id,
                    RejectedMessage::Rep,
                    RejectReason::StaleConnection,
                    &[],
                ),
            };
            let to = c.peer;
            self.send(to, env);
            self.enter_time_wait(now, id);
            self.emit(CmEvent::Rejected {
                conn: ConnId(id),
                reason: RejectReason::StaleConnection,
                ari: Vec::new(),
                private_data: Vec::new(),
                from_peer: false,
            });
            // The old connection's peer has forgotten it: close ours.
            if self.state(ConnId(old)) == Some(State::Established) {
                let _ = self.disconnect(now, ConnId(old), &[]);
            }
            return;
        }
        let target_ack_delay = self.peer_time(rep.target_ack_delay);
        let packet_life = self.packet_life();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::RepRcvd;
        c.remote_comm_id = rep.local_comm_id;
        c.remote_ca_guid = rep.local_ca_guid;
        c.remote_qpn = rep.local_qpn;
        c.time_wait = packet_life * 2 + target_ack_delay;
        c.pending = None;
        c.deadline = None;
        self.by_remote_id
            .insert((rep.local_ca_guid, rep.local_comm_id), id);
        self.by_remote_qpn
            .insert((rep.local_ca_guid, rep.local_qpn), id);
        self.emit(CmEvent::RepReceived {
            conn: ConnId(id),
            rep,
        });
    }

    pub(super) fn on_rtu(&mut self, rtu: CmRtu) {
        let Some(id) = self.lookup(rtu.remote_comm_id, rtu.local_comm_id) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::Established { conn: ConnId(id) });
            }
            // Already established by `establish`, or a duplicate.
            State::Established | State::DreqSent | State::DreqRcvd | State::TimeWait => {
                self.stats.dropped_duplicate += 1
            }
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    pub(super) fn on_dreq(&mut self, now: Instant, from: MadPeer, tid: u64, dreq: CmDreq) {
        let drep = |local_comm_id: u32, remote_comm_id: u32| Envelope {
            tid,
            msg: CmMessage::Drep(CmDrep {
                local_comm_id,
                remote_comm_id,
                private_data: PrivateData::zeroed(),
            }),
        };
        let known = self
            .conns
            .get(&dreq.remote_comm_id)
            .filter(|c| c.remote_comm_id == dreq.local_comm_id);
        let Some(c) = known else {
            // No connection has these comm ids: it is over and forgotten (time wait ended),
            // or our id went to a newer connection. A DREP lets the peer finish its
            // (IBTA 12.9.6); Linux's cm_dreq_handler answers so too (cm_issue_drep).
            self.stats.dropped_unknown_connection += 1;
            self.send(from, drep(dreq.remote_comm_id, dreq.local_comm_id));
            return;
        };
        let id = dreq.remote_comm_id;
        // Our connection, but not our QP: not ours to close (Linux drops it too).
        if c.local_qpn != dreq.remote_qpn {
            self.stats.dropped_mismatch += 1;
            return;
        }
        let conn = ConnId(id);
        match c.state {
            State::RepSent | State::MraRepRcvd | State::Established => {
                if c.state != State::Established {
                    // The RTU was lost; the DREQ proves the peer got our REP.
                    self.emit(CmEvent::Established { conn });
                }
                let c = self.conns.get_mut(&id).expect("looked up above");
                c.state = State::DreqRcvd;
                c.tid = tid;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::DisconnectRequested {
                    conn,
                    private_data: dreq.private_data.as_bytes().to_vec(),
                });
            }
            // Both sides sent DREQ (IBTA 12.9.6): answer, and close.
            State::DreqSent => {
                let to = c.peer;
                self.send(to, drep(id, dreq.local_comm_id));
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: dreq.private_data.as_bytes().to_vec(),
                    timed_out: false,
                });
            }
            // Our DREP was lost.
            State::TimeWait => {
                let to = c.peer;
                self.stats.duplicate_answers += 1;
                self.send(to, drep(id, dreq.local_comm_id));
            }
            State::DreqRcvd => self.stats.dropped_duplicate += 1,
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, drep: CmDrep) {
        let Some(id) = self.lookup(drep.remote_comm_id, drep.local_comm_id) else {
            return;
        };
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.enter_time_wait(now, id);
                self.emit(CmEvent::Disconnected {
                    conn: ConnId(id),
                    private_data: drep.private_data.as_bytes().to_vec(),
                    timed_out: false,
                });
            }
            Some(State::TimeWait) => self.stats.dropped_duplicate += 1,
            _ => self.stats.dropped_wrong_state += 1,
        }
    }

    pub(super) fn on_sidr_req(&mut self, now: Instant, from: MadPeer, tid: u64, req: SidrReq) {
        if let Some(&id) = self.sidr_in_by_request.get(&(from.gid, req.request_id)) {
            match self.sidr_in.get(&id).and_then(|e| e.reply.clone()) {
                Some(env) => {
                    self.stats.duplicate_answers += 1;
                    self.send(from, env);
                }
                None => self.stats.dropped_duplicate += 1,
            }
            return;
        }
        let Some(listen) = self.find_listener(req.service_id) else {
            self.hold_or_refuse(now, from, tid, HeldMsg::Sidr(req));
            return;
        };
        if self.sidr_in.len() >= self.config.max_connections {
            self.stats.dropped_wrong_state += 1;
            return;
        }
        let id = loop {
            let id = self.next_sidr_in;
            self.next_sidr_in = self.next_sidr_in.wrapping_add(1);
            if !self.sidr_in.contains_key(&id) {
                break id;
            }
        };
        self.sidr_in.insert(
            id,
            SidrIn {
                peer: from,
                request_id: req.request_id,
                service_id: req.service_id,
                tid,
                reply: None,
                deadline: None,
            },
        );
        self.sidr_in_by_request
            .insert((from.gid, req.request_id), id);
        self.emit(CmEvent::SidrReqReceived {
            sidr: SidrId(id),
            listen,
            from,
            service_id: req.service_id,
            pkey: req.partition_key,
            private_data: req.private_data.as_bytes().to_vec(),
        });
    }

    pub(super) fn on_sidr_rep(&mut self, rep: SidrRep) {
        let Some(_) = self.sidr_out.remove(&rep.request_id) else {
            self.stats.dropped_unknown_connection += 1;
            return;
        };
        self.emit(CmEvent::SidrRepReceived {
            sidr: SidrId(rep.request_id),
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            additional_info: rep.additional_info
                [..usize::from(rep.additional_info_length).min(ARI_LEN)]
                .to_vec(),
            private_data: rep.private_data.as_bytes().to_vec(),
        });
    }
}
