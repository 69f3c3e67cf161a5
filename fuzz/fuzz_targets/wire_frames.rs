//! Frames off a connection, as a server reads requests and a client reads replies: the header
//! checks, the buffer that grows as a frame's bytes arrive, and the decoding of every request
//! and reply type of both services (each decoded message must re-encode to itself). Nothing may
//! panic or allocate beyond what the input holds.
//!
//! Input: byte 0 chooses the side (even: requests, odd: replies); the rest is the byte stream.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().expect("runtime"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&side, stream)) = data.split_first() else { return };
    runtime().block_on(cairn_net::wire::check_frames(stream, side & 1 == 1));
});
