//! TEMPORARY stand-in until fix/cm-wire's `wire::cm` lands: an envelope is kept in a
//! thread-local table and its "bytes" are its index. Replaced by the real MAD codec.
use std::cell::RefCell;

use super::msg::Envelope;

thread_local! {
    static TABLE: RefCell<Vec<Envelope>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug)]
pub struct DecodeError;

pub fn encode(env: &Envelope) -> Vec<u8> {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        t.push(env.clone());
        ((t.len() - 1) as u64).to_be_bytes().to_vec()
    })
}

pub fn decode(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    let index: [u8; 8] = bytes.try_into().map_err(|_| DecodeError)?;
    let index = u64::from_be_bytes(index) as usize;
    TABLE.with(|t| t.borrow().get(index).cloned().ok_or(DecodeError))
}
