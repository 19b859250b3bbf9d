//! The rdma_cm of a process behind an `xroce relay` (several processes on one interface,
//! src/driver/relay.rs): the relay hands each CM MAD to QP1 to the process it is for, as
//! Linux's CM owns QP1 of the port and finds the id a MAD is for (IBTA 12.6). For that:
//! - every comm id and SIDR request id of the port's agent has the process's relay slot in
//!   bits 24..31 ([`crate::cm::CmConfig::comm_id_prefix`]): what a peer echoes names us;
//! - each service id the port listens on is registered with the relay while the listener
//!   lives ([`ServiceRegistration`]), so REQs and SIDR_REQs for it come here.
//!
//! A device with its driver to itself changes nothing: no prefix, nothing registered.
use crate::cm::{CmConfig, CmError, ListenId};
use crate::driver::relay::{ServiceRegistration, ServiceRegistrationError};
use crate::verbs::Device;

use super::registry::Port;
use super::{RdmaCmError, Result};

/// The agent's settings for `device`: its relay slot as the comm id prefix, if any.
pub(crate) fn agent_config(device: &Device, config: &mut CmConfig) {
    if let Some(relay) = device.relay_endpoint() {
        config.comm_id_prefix = Some(relay.slot);
    }
}

/// Listens on `service_id` on `port` (`rdma_listen`): the agent's listener, and behind a
/// relay its registration. Another process of the interface listening on it already is
/// [`CmError::ServiceIdInUse`] (EADDRINUSE, as the kernel's rdma_listen says for a port
/// another process listens on).
pub(crate) fn listen(port: &mut Port, service_id: u64) -> Result<ListenId> {
    let listen = port.agent.listen(service_id, None)?;
    let Some(relay) = port.device.relay_endpoint().cloned() else {
        return Ok(listen);
    };
    match ServiceRegistration::register(&relay, service_id, u64::MAX) {
        Ok(reg) => {
            port.relay_services.insert(listen, reg);
            Ok(listen)
        }
        Err(e) => {
            let _ = port.agent.unlisten(listen);
            Err(match e {
                ServiceRegistrationError::InUse { .. } => {
                    RdmaCmError::Cm(CmError::ServiceIdInUse {
                        service_id,
                        mask: u64::MAX,
                    })
                }
                ServiceRegistrationError::Relay(e) => {
                    RdmaCmError::Verbs(crate::verbs::VerbsError::from(e))
                }
            })
        }
    }
}

/// Stops listening: the agent's listener and the relay registration (dropped: the relay
/// sees its connection close).
pub(crate) fn unlisten(port: &mut Port, listen: ListenId) {
    let _ = port.agent.unlisten(listen);
    port.relay_services.remove(&listen);
}
