//! What the agent queues to send: a CM message of `crate::wire::cm` with the transaction id
//! of its MAD header (IBTA 13.4.6.4), and the codec between that and MAD bytes.

use crate::wire::cm::{CmMad, CmMessage};
use crate::wire::mad::MadError;

/// A message with the transaction id of its MAD header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub tid: u64,
    pub msg: CmMessage,
}

impl Envelope {
    pub fn encode(&self) -> Result<Vec<u8>, MadError> {
        Ok(CmMad::new(self.tid, self.msg).to_bytes()?.to_vec())
    }

    /// A CM MAD of class version 2, method Send (IBTA 12.6.1), or why not.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, MadError> {
        let mad = CmMad::parse(bytes)?;
        Ok(Envelope {
            tid: mad.header.transaction_id,
            msg: mad.message,
        })
    }
}
