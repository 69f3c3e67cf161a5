fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cairn.proto");
    tonic_prost_build::configure()
        .bytes(".cairn.v1.WriteShardRequest.data")
        .bytes(".cairn.v1.ReadShardReply.data")
        .bytes(".cairn.v1.ReadShardReply.tree")
        // Stripe infos are cloned on every read and write of a file: a shared buffer.
        .bytes(".cairn.v1.StripeInfo.hashes")
        // Encoded by group 0's leader into its log and shared: in slot order, the same bytes
        // for the same map.
        .btree_map(".cairn.v1.GroupMap.floors")
        .compile_protos(&["proto/cairn.proto"], &["proto"])?;
    Ok(())
}
