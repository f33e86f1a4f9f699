//! Static pod manifests: parse, default and validate any text, and take every
//! pod that comes through on to what the agent does with it next (actions,
//! status, CRI configs). None of it may panic, and what passes validation
//! must still pass it.
#![no_main]

use evlet::pod::{self, PodUid};
use evlet::runtime::PodStatus;
use evlet::source::manifest::{self, StaticKind};
use evlet::sync::spec::{self, ContainerContext, NodeContext};
use evlet::{status, sync, validation};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = manifest::parse(text, "/fuzz/pod.yaml", StaticKind::File, "fuzz-node");
    let node = NodeContext {
        node_name: "fuzz-node".into(),
        root_dir: "/var/lib/evlet".into(),
        cgroups: evlet::cm::Names::new(evlet::cm::Driver::Cgroupfs, "/"),
        host_ip: Some("192.0.2.1".into()),
        memory_capacity: 8 << 30,
        ..Default::default()
    };
    for p in &parsed.pods {
        assert!(validation::validate(p).is_ok(), "a parsed pod is valid");
        let runtime = PodStatus::empty(PodUid::from(pod::uid(p).0.as_str()));
        let _ = sync::actions::compute(p, &runtime);
        let _ = status::compute(p, &runtime, &status::Extra::default());
        let _ = spec::sandbox_config(&node, p, 0);
        let objects = sync::env::ApiObjects::default();
        for c in p.spec.iter().flat_map(|s| &s.containers) {
            let ctx = ContainerContext {
                kind: evlet::runtime::Kind::App,
                restart_count: 0,
                pod_ip: Some("10.88.0.2"),
                objects: &objects,
                services: &[],
                termination_log: Some(std::path::Path::new("/fuzz/termination-log")),
                mounts: &[],
            };
            let _ = spec::container_config(&node, p, c, &ctx);
        }
    }
});
