"""The method sets SGLang and Mooncake's own tests use (Mooncake 0.3.13's non-CUDA wheel)
exist under Mooncake's names."""

import mooncake.engine
import mooncake.store

ENGINE = """initialize initialize_ext get_rpc_port allocate_managed_buffer free_managed_buffer
transfer_sync_write transfer_sync_read batch_transfer_sync_write batch_transfer_sync_read
batch_transfer_async_write batch_transfer_async_read get_batch_transfer_status transfer_sync
batch_transfer_sync batch_transfer_async transfer_submit_write transfer_check_status
write_bytes_to_buffer read_bytes_from_buffer register_memory unregister_memory
batch_register_memory batch_unregister_memory get_first_buffer_address get_notifies send_probe
get_local_topology get_engine get_engine_ptr warmup_efa_segment""".split()

STORE = """setup setup_dummy put get is_exist batch_is_exist register_buffer unregister_buffer
batch_put_from batch_get_into batch_put_from_multi_buffers batch_get_into_multi_buffers
remove_all put_batch get_batch get_buffer batch_get_buffer get_size remove remove_by_regex
batch_remove put_from get_into get_into_ranges upsert upsert_from upsert_batch
batch_upsert_from close get_hostname health_check batch_get_session_start
batch_get_into_multi_buffer_ranges batch_get_session_end batch_put_session_start
batch_put_from_multi_buffer_ranges batch_put_session_end batch_put_session_revoke
get_offload_rpc_read_count""".split()

REPLICATE = """replica_num with_hard_pin preferred_segment preferred_segments soft_pin_action
soft_pin_ttl_ms nof_replica_num dfs_replica_num preferred_nof_segments
prefer_alloc_in_same_node data_type group_ids""".split()


def test_method_sets():
    assert [m for m in ENGINE if not hasattr(mooncake.engine.TransferEngine, m)] == []
    assert [m for m in STORE if not hasattr(mooncake.store.MooncakeDistributedStore, m)] == []
    cfg = mooncake.store.ReplicateConfig()
    assert [f for f in REPLICATE if not hasattr(cfg, f)] == []
    assert {a.name for a in (mooncake.store.SoftPinAction.PRESERVE, mooncake.store.SoftPinAction.ENABLE,
                             mooncake.store.SoftPinAction.DISABLE)} == {"PRESERVE", "ENABLE", "DISABLE"}
    assert mooncake.__moongate__ is True
