//! Two-sided checks of a peer's memory, each speaking the exchange of a lab script so that it
//! pairs with itself or with rxe in the lab's guests: [`mr`] (`xroce mr-check`: READ, WRITE and
//! READ-back of a registered buffer; `lab-mr.py`) and [`mw`] (`xroce mw-check`: memory windows
//! used and refused; `lab-mw.py`).
pub mod mr;
pub mod mw;
