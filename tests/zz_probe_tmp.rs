#![allow(missing_docs)]
use std::time::Duration;
use nuvec_core::DType;
use nuvec_distributed::RingCommunicator;
use nuvec_distributed::fabric::{Channel, Fabric};
use nuvec_distributed::reduce::Reduction;
use nuvec_fabric_sim::{Fault, Sim};

fn go(name: &str, sim: Sim) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let report = sim.run(|fabric| {
            let t0 = fabric.now();
            let comm = RingCommunicator::new(fabric, 1, Duration::from_secs(30));
            let mut data = vec![1u8; 4 * 100_000];
            let r = comm.try_all_reduce(Reduction::Sum, DType::F32, &mut data);
            (r.map_err(|e| e.to_string()).map(|_| ()), t0)
        });
        let _ = tx.send((report.outcomes, report.end));
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok((o, end)) => { println!("{name}: end {end:?}"); for x in o { println!("   {x:?}"); } }
        Err(_) => println!("{name}: HUNG (no report after 10 s wall)"),
    }
}

#[test]
fn probe() {
    go("crash call 3", Sim::ring(4, 1).seed(1).fault(Fault::Crash { rank: 2, call: 3 }));
    go("crash at 20us", Sim::ring(4, 1).seed(1).fault(Fault::CrashAt { rank: 2, at: Duration::from_micros(20) }));
    go("stall 40s", Sim::ring(4, 1).seed(1).fault(Fault::Stall { rank: 2, at: Duration::from_micros(20), duration: Duration::from_secs(40) }));
    go("cut", Sim::ring(4, 1).seed(1).fault(Fault::Cut { rank: 2, channel: Channel::new(3, 0), at: Duration::from_micros(20) }));
}
