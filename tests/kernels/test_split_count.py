"""How many splits the Triton decode launches (a pure function of device, occupancy and shapes)."""

from sparrow.kernels.decode_triton import MAX_SPLITS, choose_num_splits, ctas_per_sm

H200_SMS = 132


def test_full_wave_of_rows_takes_one_split_and_no_merge():
    # 64 sequences x 8 KV heads = 512 rows >= 132 SMs x 2 resident CTAs.
    assert choose_num_splits(512, 2048, 2, H200_SMS, 2) == 1


def test_few_long_rows_split_to_fill_one_wave():
    # 2 x 8 rows of 2K pages: 264 resident CTAs / 16 rows -> 17 splits.
    assert choose_num_splits(16, 2048, 2, H200_SMS, 2) == 17
    # more resident CTAs per SM (a leaner kernel) -> more splits, capped by the merge width
    assert choose_num_splits(16, 2048, 2, H200_SMS, 4) == MAX_SPLITS


def test_short_rows_are_not_split_below_a_few_iterations():
    # 128 pages at 2 pages per iteration: 64 iterations -> at most 16 splits of 4.
    assert choose_num_splits(16, 128, 2, H200_SMS, 2) == 16
    assert choose_num_splits(16, 6, 2, H200_SMS, 2) == 1  # 3 iterations: not worth a merge
    assert choose_num_splits(1, 1, 1, H200_SMS, 1) == 1


def test_split_count_follows_the_sm_count():
    assert choose_num_splits(16, 4096, 2, 66, 2) == 9
    assert choose_num_splits(16, 4096, 2, 132, 2) == 17


def test_occupancy_from_registers_and_shared_memory():
    assert ctas_per_sm(regs=255, smem_bytes=12288, num_warps=4) == 2  # 65536 / (255 x 128)
    assert ctas_per_sm(regs=64, smem_bytes=12288, num_warps=4) == 8
    assert ctas_per_sm(regs=32, smem_bytes=100 * 1024, num_warps=4) == 2  # shared-bound
    assert ctas_per_sm(regs=32, smem_bytes=0, num_warps=8) == 8  # 64 warps per SM
