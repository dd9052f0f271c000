//! What sealed bodies cost per operation, measured: a client seals its operation and opens
//! the result, every executor opens the operation and seals the result (`crate::bodies`).
//! `cargo run --release -p redoubt-core --example seal_cost`; the figures are in
//! docs/benchmarks.md ("Sealed bodies").

use redoubt_core::bodies;
use redoubt_crypto::body::{establish, ExecutorSecret};
use std::time::Instant;

fn main() {
    let exec = ExecutorSecret::from_seed(&[1; 32]);
    let (enc, client_key) = establish(&exec.public(), b"client 1", [2; 32]).expect("session");
    let t = Instant::now();
    let sessions = 200;
    for i in 0..sessions {
        let (e, _) = establish(&exec.public(), b"client 1", [i as u8; 32]).expect("session");
        std::hint::black_box(exec.open(b"client 1", &e));
    }
    let per_session = t.elapsed().as_secs_f64() * 1e6 / sessions as f64;
    println!("a new body session (client encapsulates, one executor opens): {per_session:.1} µs");
    let exec_key = exec.open(b"client 1", &enc).expect("opens");
    println!("| operation/result (bytes) | client: seal op + open result (µs) | each executor: open op + seal result (µs) |");
    println!("|---|---|---|");
    for (op_len, res_len) in [(40usize, 40usize), (40, 4096), (4096, 40), (0, 0)] {
        let op = vec![7u8; op_len];
        let res = vec![9u8; res_len];
        let n = 200_000u64;
        let mut client_ns = 0f64;
        let mut exec_ns = 0f64;
        for ts in 1..=n {
            let t0 = Instant::now();
            let sealed = bodies::seal_op(&client_key, &enc, 1, ts, false, &op);
            let t1 = Instant::now();
            let plain = bodies::open_op(&exec_key, 1, ts, false, &sealed).expect("opens");
            let sealed_res = bodies::seal_result(&exec_key, 1, ts, &res);
            let t2 = Instant::now();
            let out = bodies::open_result(&client_key, 1, ts, &sealed_res);
            let t3 = Instant::now();
            std::hint::black_box((plain, out));
            client_ns += ((t1 - t0) + (t3 - t2)).as_nanos() as f64;
            exec_ns += (t2 - t1).as_nanos() as f64;
        }
        println!(
            "| {op_len}/{res_len} | {:.2} | {:.2} |",
            client_ns / n as f64 / 1e3,
            exec_ns / n as f64 / 1e3
        );
    }
}
