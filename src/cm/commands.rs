//! The caller's calls on an agent: connect, accept, MRA and RTU, establish, reject,
//! disconnect and abandon a connection; SIDR requests and replies.

use crate::wire::cm::{
    CmDrep, CmDreq, CmMessage, CmMra, CmPath, CmRej, CmRep, CmReq, CmRtu, FailoverAccepted,
    MraedMessage, RejectReason, RejectedMessage, SidrRep, SidrReq, TransportType,
};

use super::agent::*;
use super::msg::Envelope;
use super::types::*;
use super::Instant;

impl CmAgent {
    /// Send a REQ (IBTA 12.6.5) and wait for REP, resending it every
    /// 2 × packet lifetime + 4.096 µs × 2^cm_response_timeout, `max_cm_retries` times.
    pub fn connect(&mut self, now: Instant, request: ConnectRequest) -> Result<ConnId, CmError> {
        let private_data = private(&request.private_data)?;
        check_bits("qpn", request.qpn, 24)?;
        check_bits("starting_psn", request.starting_psn, 24)?;
        check_bits("retry_count", request.retry_count.into(), 3)?;
        check_bits("rnr_retry_count", request.rnr_retry_count.into(), 3)?;
        check_bits("max_cm_retries", request.max_cm_retries.into(), 4)?;
        check_bits("cm_response_timeout", request.cm_response_timeout.into(), 5)?;
        check_bits("local_ack_timeout", request.local_ack_timeout.into(), 5)?;
        check_bits("flow_label", request.flow_label, 20)?;
        check_bits("sl", request.sl.into(), 4)?;
        if request.path_mtu.bytes().is_none() {
            return Err(CmError::OutOfRange {
                field: "path_mtu",
                value: request.path_mtu.code().into(),
            });
        }
        if !matches!(request.transport, TransportType::Rc | TransportType::Uc) {
            return Err(CmError::OutOfRange {
                field: "transport",
                value: request.transport.code().into(),
            });
        }
        if self.conns.len() >= self.config.max_connections {
            return Err(CmError::TooManyConnections(self.conns.len()));
        }
        let local_comm_id = self.alloc_comm_id();
        let tid = self.alloc_tid();
        let req = CmReq {
            local_comm_id,
            service_id: request.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: request.qkey,
            local_qpn: request.qpn,
            responder_resources: request.responder_resources,
            initiator_depth: request.initiator_depth,
            remote_cm_response_timeout: request.cm_response_timeout,
            transport_type: request.transport,
            starting_psn: request.starting_psn,
            local_cm_response_timeout: self.config.local_cm_response_timeout.min(31),
            retry_count: request.retry_count,
            partition_key: request.pkey,
            path_mtu: request.path_mtu,
            rnr_retry_count: request.rnr_retry_count,
            max_cm_retries: request.max_cm_retries,
            srq: request.srq,
            primary_path: CmPath {
                local_lid: 0,
                remote_lid: 0,
                local_gid: request.local_gid.0,
                remote_gid: request.remote_gid.0,
                flow_label: request.flow_label,
                packet_rate: 0,
                traffic_class: request.traffic_class,
                hop_limit: request.hop_limit,
                sl: request.sl,
                subnet_local: false,
                local_ack_timeout: request.local_ack_timeout,
            },
            private_data,
            ..CmReq::default()
        };
        let response_timeout = self.packet_life() * 2 + iba_time(request.cm_response_timeout);
        let env = Envelope {
            tid,
            msg: CmMessage::Req(req),
        };
        self.conns.insert(
            local_comm_id,
            Conn {
                state: State::ReqSent,
                peer: request.to,
                remote_comm_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: request.qpn,
                tid,
                max_cm_retries: request.max_cm_retries,
                response_timeout,
                time_wait: self.packet_life() * 2,
                pending: Some(Pending {
                    env: env.clone(),
                    retries_left: request.max_cm_retries,
                }),
                answer: None,
                deadline: Some(now + response_timeout),
                mra_seen: false,
            },
        );
        self.send(request.to, env);
        Ok(ConnId(local_comm_id))
    }

    /// Answer a REQ with REP (IBTA 12.6.8); wait for RTU, resending the REP as the REQ's
    /// "Local CM Response Timeout" and "Max CM Retries" say.
    pub fn accept(
        &mut self,
        now: Instant,
        conn: ConnId,
        params: ReplyParams,
    ) -> Result<(), CmError> {
        let private_data = private(&params.private_data)?;
        check_bits("qpn", params.qpn, 24)?;
        check_bits("starting_psn", params.starting_psn, 24)?;
        check_bits("rnr_retry_count", params.rnr_retry_count.into(), 3)?;
        check_bits("target_ack_delay", params.target_ack_delay.into(), 5)?;
        let local_ca_guid = self.config.local_ca_guid;
        let packet_life = self.packet_life();
        let target_ack_delay = iba_time(params.target_ack_delay);
        let c = self.conn_mut(conn)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::WrongState {
                conn,
                state: c.state,
            });
        }
        let rep = CmRep {
            local_comm_id: conn.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: params.qkey,
            local_qpn: params.qpn,
            starting_psn: params.starting_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: params.target_ack_delay,
            // RoCE has no alternate path (IBTA 12.6.8).
            failover_accepted: FailoverAccepted::NotSupported,
            end_to_end_flow_control: params.end_to_end_flow_control,
            rnr_retry_count: params.rnr_retry_count,
            srq: params.srq,
            local_ca_guid,
            private_data,
            ..CmRep::default()
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rep(rep),
        };
        c.state = State::RepSent;
        c.local_qpn = params.qpn;
        c.time_wait = packet_life * 2 + target_ack_delay;
        c.pending = Some(Pending {
            env: env.clone(),
            retries_left: c.max_cm_retries,
        });
        c.answer = None;
        c.deadline = Some(now + c.response_timeout);
        let to = c.peer;
        self.send(to, env);
        Ok(())
    }

    /// Send MRA (IBTA 12.6.6) for the REQ (passive, before accept) or the REP (active,
    /// before send_rtu): the peer waits `4.096 µs × 2^service_timeout` longer.
    pub fn send_mra(
        &mut self,
        _now: Instant,
        conn: ConnId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        check_bits("service_timeout", service_timeout.into(), 5)?;
        let c = self.conn_mut(conn)?;
        let (kind, next) = match c.state {
            State::ReqRcvd | State::MraReqSent => (MraedMessage::Req, State::MraReqSent),
            State::RepRcvd | State::MraRepSent => (MraedMessage::Rep, State::MraRepSent),
            state => return Err(CmError::WrongState { conn, state }),
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Mra(CmMra {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_mraed: kind,
                service_timeout,
                private_data,
            }),
        };
        c.state = next;
        c.answer = Some(env.clone());
        let to = c.peer;
        self.send(to, env);
        Ok(())
    }

    /// Active side, after RepReceived and moving the QP to RTR/RTS: send RTU (IBTA 12.6.9);
    /// the connection is established.
    pub fn send_rtu(
        &mut self,
        _now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        let c = self.conn_mut(conn)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmError::WrongState {
                conn,
                state: c.state,
            });
        }
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rtu(CmRtu {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                private_data,
            }),
        };
        c.state = State::Established;
        c.answer = Some(env.clone());
        let to = c.peer;
        self.send(to, env);
        self.emit(CmEvent::Established { conn });
        Ok(())
    }

    /// Passive side: data arrived on the QP before the RTU (lost or late): the connection is
    /// established all the same (IBTA 12.9.6, "communication established" event).
    pub fn establish(&mut self, _now: Instant, conn: ConnId) -> Result<(), CmError> {
        let c = self.conn_mut(conn)?;
        match c.state {
            State::RepSent | State::MraRepRcvd => {
                c.state = State::Established;
                c.pending = None;
                c.deadline = None;
                self.emit(CmEvent::Established { conn });
                Ok(())
            }
            State::Established => Ok(()),
            state => Err(CmError::WrongState { conn, state }),
        }
    }

    /// Refuse a REQ (passive, before accept), a REP (active, before send_rtu), or give up
    /// waiting for an RTU, with REJ (IBTA 12.6.7). A connection that got as far as a REP
    /// goes to time wait, an earlier one is gone at once.
    pub fn reject(
        &mut self,
        now: Instant,
        conn: ConnId,
        reason: RejectReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = private(private_data)?;
        let (ari, reject_info_length) = ari_field(ari)?;
        let c = self.conn_mut(conn)?;
        let (kind, time_wait) = match c.state {
            State::ReqRcvd | State::MraReqSent => (RejectedMessage::Req, false),
            State::RepRcvd | State::MraRepSent => (RejectedMessage::Rep, true),
            State::RepSent | State::MraRepRcvd => (RejectedMessage::Other, true),
            state => return Err(CmError::WrongState { conn, state }),
        };
        let env = Envelope {
            tid: c.tid,
            msg: CmMessage::Rej(CmRej {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                message_rejected: kind,
                reject_info_length,
                reason,
                ari,
                private_data,
            }),
        };
        let to = c.peer;
        self.send(to, env);
        if time_wait {
            self.enter_time_wait(now, conn.0);
        } else {
            self.remove(conn.0);
        }
        Ok(())
    }

    /// Established: send DREQ (IBTA 12.6.10), resent like the REQ until DREP or the
    /// retries run out. After DisconnectRequested: answer with DREP (IBTA 12.6.11).
    /// Either way the connection ends in time wait.
    pub fn disconnect(
        &mut self,
        now: Instant,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.conn_mut(conn)?.state;
        match state {
            State::Established => {
                let private_data = private(private_data)?;
                let tid = self.alloc_tid();
                let c = self.conn_mut(conn)?;
                let env = Envelope {
                    tid,
                    msg: CmMessage::Dreq(CmDreq {
                        local_comm_id: conn.0,
                        remote_comm_id: c.remote_comm_id,
                        remote_qpn: c.remote_qpn,
                        private_data,
                    }),
                };
                c.tid = tid;
                c.state = State::DreqSent;
                c.answer = None;
                c.pending = Some(Pending {
                    env: env.clone(),
                    retries_left: c.max_cm_retries,
                });
                c.deadline = Some(now + c.response_timeout);
                let to = c.peer;
                self.send(to, env);
                Ok(())
            }
            State::DreqRcvd => {
                let private_data = private(private_data)?;
                let c = self.conn_mut(conn)?;
                let env = Envelope {
                    tid: c.tid,
                    msg: CmMessage::Drep(CmDrep {
                        local_comm_id: conn.0,
                        remote_comm_id: c.remote_comm_id,
                        private_data,
                    }),
                };
                let to = c.peer;
                self.send(to, env);
                self.enter_time_wait(now, conn.0);
                self.emit(CmEvent::Disconnected {
                    conn,
                    private_data: Vec::new(),
                    timed_out: false,
                });
                Ok(())
            }
            state => Err(CmError::WrongState { conn, state }),
        }
    }

    /// The user is done with a connection, whatever its state (rdma_destroy_id): the peer
    /// is told as the state requires, as the kernel's cm.c does on destroy — REJ "timeout"
    /// for our REQ, REJ "consumer defined" before Established, one DREQ (not resent) when
    /// established, DREP after a DREQ — and a connection that may still get packets stays in
    /// time wait. No more events come for it.
    pub fn abandon(&mut self, now: Instant, conn: ConnId) -> Result<(), CmError> {
        let state = self.conn_mut(conn)?.state;
        self.abandoned.insert(conn.0);
        let consumer = RejectReason::ConsumerDefined;
        match state {
            State::ReqSent | State::MraReqRcvd => {
                self.send_timeout_rej(conn.0);
                self.remove(conn.0);
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => self.reject(now, conn, consumer, &[], &[])?,
            State::Established => {
                self.disconnect(now, conn, &[])?;
                self.enter_time_wait(now, conn.0);
            }
            State::DreqSent => self.enter_time_wait(now, conn.0),
            State::DreqRcvd => self.disconnect(now, conn, &[])?,
            State::TimeWait => {}
        }
        Ok(())
    }

    /// Ask a peer which UD QP serves `service_id` (IBTA 12.11.1); answered by
    /// SidrRepReceived or, after `1 + max_retries` unanswered sends, SidrTimeout.
    pub fn sidr_request(&mut self, now: Instant, request: SidrRequest) -> Result<SidrId, CmError> {
        let private_data = private(&request.private_data)?;
        check_bits("timeout", request.timeout.into(), 5)?;
        let request_id = loop {
            let id = self.local_id(self.next_sidr_request);
            self.next_sidr_request = self.next_sidr_request.wrapping_add(1);
            if id != 0 && !self.sidr_out.contains_key(&id) {
                break id;
            }
        };
        let tid = self.alloc_tid();
        let env = Envelope {
            tid,
            msg: CmMessage::SidrReq(SidrReq {
                request_id,
                partition_key: request.pkey,
                service_id: request.service_id,
                private_data,
            }),
        };
        let timeout = self.packet_life() * 2 + iba_time(request.timeout);
        self.sidr_out.insert(
            request_id,
            SidrOut {
                peer: request.to,
                env: env.clone(),
                retries_left: request.max_retries,
                timeout,
                deadline: now + timeout,
            },
        );
        self.send(request.to, env);
        Ok(SidrId(request_id))
    }

    /// Answer a SidrReqReceived with SIDR_REP (IBTA 12.11.2).
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        sidr: SidrId,
        reply: SidrReply,
    ) -> Result<(), CmError> {
        let private_data = private(&reply.private_data)?;
        check_bits("qpn", reply.qpn, 24)?;
        let linger = self.config.sidr_reply_linger;
        let entry = self
            .sidr_in
            .get_mut(&sidr.0)
            .filter(|e| e.reply.is_none())
            .ok_or(CmError::NoSuchSidr(sidr))?;
        let tid = entry.tid;
        let env = Envelope {
            tid,
            msg: CmMessage::SidrRep(SidrRep {
                request_id: entry.request_id,
                status: reply.status,
                qpn: reply.qpn,
                service_id: entry.service_id,
                qkey: reply.qkey,
                private_data,
                ..SidrRep::default()
            }),
        };
        entry.reply = Some(env.clone());
        entry.deadline = Some(now + linger);
        let to = entry.peer;
        self.send(to, env);
        Ok(())
    }
}
