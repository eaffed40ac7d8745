# Multi-rank tests, run under mpirun by ctest (included from tests/CMakeLists.txt).
#
#   mpi_comm_np{1,2,3,4,8}   every collective, send/recv and batch on the MPI backend (Local at 1)
#   mpi_comm_staged_np{1,2,3,4}  the same on staged communicators (--staged): device tensors
#                            carried over MPI through host copies, as for ranks sharing a GPU
#   mpi_comm_singleton       the same binary without mpirun: world size 1, no MPI
#   mpi_watchdog             a deliberately missing send: the job must abort with the watchdog
#                            line within timeout + 5 s
#   mpi_launch_faults        start-up and shutdown bounded by comm.timeout_s; orphaned ranks stop
#   mpi_input_error_one_rank bad data one rank reads: its line and exit 2 within seconds
#   mpi_strata_run_print     launch/strata-run computes -np and the mpirun flags from a config
#   mpi_multihost_faults     two network namespaces as two hosts (2 ranks each, TCP between them):
#                            the same losses as on one host; a cut link reported by the watchdog
#                            and every rank gone within comm.timeout_s + 5 s; strata-run's
#                            restart completes the job once the link is back (skipped without root)
#   mpi_layout_np4           --dry-run, the planner and training use one layer split
#   mpi_expert_{mixtral,qwen3_moe}_np4  expert parallelism against the single process (every
#                            layout with expert 2 and 4, schedules, bf16, checkpoints across
#                            expert sizes); mpi_expert_qwen3_moe_dense_np4 and
#                            mpi_pipeline_qwen3_moe_dense_np2 the same with Qwen3-MoE's dense
#                            layers
#   mpi_context_{gpt,llama,bert}_np4  context parallelism against the single process (context 2
#                            and 4, with data and ZeRO-1, tensor and sp, recompute, every
#                            schedule at pipeline 2, bf16, checkpoints across context sizes);
#                            mpi_context_{mixtral,qwen3_moe}_np4 the mixtures (with expert 2)
#   mpi_generate_np1, mpi_generate_tp2  `strata generate` equals transformers' greedy decoding,
#                            alone and at tensor 2 (tests/golden/generate/); with
#                            mpi_training_samples_np4, samples during training at every layout
#   mpi_nccl_np{1,2}         (CUDA builds) the NCCL backend; skips visibly without devices
#   mpi_watchdog_nccl        (CUDA builds) mpi_watchdog on the NCCL backend: the NCCL watchdog
#                            thread must fire; skips without a device per rank
#   In the CUDA emulation build the NCCL tests run on emulated devices (STRATA_EMULATED_DEVICES)
#   over the emulated NCCL (runtime/comm/cuda/emulation/nccl.cc), mpi_nccl_np3 too.
#
# Ranks are oversubscribed (CI machines have 2 cores), with one OpenMP thread each.

set(STRATA_MPI_RUN ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root)
set(STRATA_MPI_ENV "OMP_NUM_THREADS=1")

function(strata_mpi_executable name)
  add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/${name}.cc)
  target_link_libraries(${name} PRIVATE strata_launch GTest::gtest)
  target_compile_options(${name} PRIVATE ${STRATA_WARNINGS})
endfunction()

# strata_mpi_test(TARGET PREFIX NP...): one ctest per rank count, named PREFIX_npN.
function(strata_mpi_test target prefix)
  foreach(np ${ARGN})
    add_test(NAME ${prefix}_np${np}
             COMMAND ${STRATA_MPI_RUN} -np ${np} $<TARGET_FILE:${target}>)
    set_tests_properties(${prefix}_np${np} PROPERTIES
      ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 120 PROCESSORS ${np} LABELS mpi)
  endforeach()
endfunction()

strata_mpi_executable(mpi_test_comm)
strata_mpi_test(mpi_test_comm mpi_comm 1 2 3 4 8)
# The same tests on staged communicators (device tensors of ranks sharing a GPU, over MPI).
foreach(np 1 2 3 4)
  add_test(NAME mpi_comm_staged_np${np}
           COMMAND ${STRATA_MPI_RUN} -np ${np} $<TARGET_FILE:mpi_test_comm> --staged)
  set_tests_properties(mpi_comm_staged_np${np} PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 120 PROCESSORS ${np} LABELS mpi)
endforeach()
add_test(NAME mpi_comm_singleton COMMAND mpi_test_comm)
set_tests_properties(mpi_comm_singleton PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 60
                     LABELS mpi)

add_executable(mpi_watchdog_probe ${CMAKE_CURRENT_SOURCE_DIR}/mpi_watchdog_probe.cc)
target_link_libraries(mpi_watchdog_probe PRIVATE strata_launch)
target_compile_options(mpi_watchdog_probe PRIVATE ${STRATA_WARNINGS})
add_test(NAME mpi_watchdog
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_watchdog_check.sh ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:mpi_watchdog_probe> 3)
set_tests_properties(mpi_watchdog PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 60
                     PROCESSORS 2 LABELS mpi)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME mpi_strata_run_print
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/mpi_strata_run_check.py
                   ${PROJECT_SOURCE_DIR}/launch/strata-run)
  set_tests_properties(mpi_strata_run_print PROPERTIES TIMEOUT 30 LABELS mpi)
endif()

if(STRATA_HAVE_CUDA)
  set(nccl_ranks 1 2)
  set(nccl_env "${STRATA_MPI_ENV}")
  if(STRATA_CUDA_EMULATION)
    set(nccl_ranks 1 2 3)
    set(nccl_env "${STRATA_MPI_ENV};STRATA_EMULATED_DEVICES=4")
  endif()
  strata_mpi_executable(mpi_test_nccl)
  strata_mpi_test(mpi_test_nccl mpi_nccl ${nccl_ranks})
  foreach(np ${nccl_ranks})
    # Without a CUDA device every test skips: ctest reports the run as skipped, not passed.
    set_tests_properties(mpi_nccl_np${np} PROPERTIES ENVIRONMENT "${nccl_env}"
      SKIP_REGULAR_EXPRESSION "SKIPPED \\][^\n]*tests?, listed below")
  endforeach()
  add_test(NAME mpi_watchdog_nccl
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_watchdog_check.sh ${MPIEXEC_EXECUTABLE}
                   $<TARGET_FILE:mpi_watchdog_probe> 3 nccl)
  set_tests_properties(mpi_watchdog_nccl PROPERTIES ENVIRONMENT "${nccl_env}" TIMEOUT 60
                       PROCESSORS 2 LABELS mpi SKIP_RETURN_CODE 77)
endif()

# Tensor / sequence / data parallelism against the single-process run (issue 4).
strata_mpi_executable(mpi_test_parallel)
strata_mpi_test(mpi_test_parallel mpi_parallel 2 4 8)
set_tests_properties(mpi_parallel_np2 mpi_parallel_np4 mpi_parallel_np8 PROPERTIES TIMEOUT 600)

# Pipeline schedules and the executor against the single-process run (issue 5).
strata_mpi_executable(mpi_test_pipeline)
strata_mpi_test(mpi_test_pipeline mpi_pipeline 2 4 8)
set_tests_properties(mpi_pipeline_np2 mpi_pipeline_np4 mpi_pipeline_np8 PROPERTIES TIMEOUT 900)

# Checkpoints (issue 8): resharding between layouts, bit-exact resume under MPI, and the
# fault scenarios (a rank SIGKILLed mid-run, a kill during a save) driven by a shell script.
strata_mpi_executable(mpi_test_checkpoint)
strata_mpi_test(mpi_test_checkpoint mpi_checkpoint 4)
set_tests_properties(mpi_checkpoint_np4 PROPERTIES TIMEOUT 300)
add_test(NAME mpi_checkpoint_faults
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_checkpoint_faults.sh ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:strata>)
set_tests_properties(mpi_checkpoint_faults PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 300
                     PROCESSORS 2 LABELS mpi)
# SIGUSR1 to mpirun: every rank stops after the same iteration with its checkpoint, exit status
# 4, and the rerun resumes bit for bit (1f1b and 2bw; launch/train/stop_request.h).
add_test(NAME mpi_stop_signal
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_stop_signal.sh ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:strata>)
# 65 s unsanitized; the sanitizer stages run it at 275-290 s (ASan, TSan), too close to a 300 s
# bound on a loaded machine: 900, as the sanitizer stages' own default.
set_tests_properties(mpi_stop_signal PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 900
                     PROCESSORS 2 LABELS mpi)
# launch/strata-run --max-restarts: a rank that dies once is relaunched and the job resumes from
# its newest checkpoint to the uninterrupted final loss; one that dies at the same step again
# makes strata-run give up with the reason.
add_test(NAME mpi_strata_run_restart
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_strata_run_restart.sh
                 ${PROJECT_SOURCE_DIR}/launch/strata-run $<TARGET_FILE:strata>)
set_tests_properties(mpi_strata_run_restart PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}"
                     TIMEOUT 300 PROCESSORS 2 LABELS mpi)

# Multi-host faults for real (issue 27): two network namespaces joined by a veth pair play two
# hosts of 2 ranks each (tests/mpi_multihost_faults.sh). Skipped (status 77) where namespaces
# cannot be created: not root, no iproute2.
add_test(NAME mpi_multihost_faults
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_multihost_faults.sh ${MPIEXEC_EXECUTABLE}
                 ${PROJECT_SOURCE_DIR}/launch/strata-run $<TARGET_FILE:strata>)
set_tests_properties(mpi_multihost_faults PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 300
                     PROCESSORS 4 LABELS mpi SKIP_RETURN_CODE 77)

# Hangs outside the training loop (issue 28): a rank stopped in start-up, a stopped mpirun at
# shutdown, a killed mpirun (the orphaned ranks stop at once), each bounded by comm.timeout_s.
add_test(NAME mpi_launch_faults
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_launch_faults.sh ${MPIEXEC_EXECUTABLE}
                 $<TARGET_FILE:strata>)
set_tests_properties(mpi_launch_faults PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}" TIMEOUT 300
                     PROCESSORS 3 LABELS mpi)

# Bad data only one rank reads ends the job with its line and exit 2 within seconds, not
# behind the watchdog (issue 39), under data 2 and pipeline 2.
add_test(NAME mpi_input_error_one_rank
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi_input_error_one_rank.sh
                 ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:strata>)
set_tests_properties(mpi_input_error_one_rank PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}"
                     TIMEOUT 300 PROCESSORS 2 LABELS mpi)

# The planner's per-stage memory prediction against the allocator under several layouts (issue 6).
strata_mpi_executable(mpi_test_memory)
strata_mpi_test(mpi_test_memory mpi_memory 4)

# One layer split for --dry-run, the planner's prediction and training (the model-interface issue).
strata_mpi_executable(mpi_test_layout)
strata_mpi_test(mpi_test_layout mpi_layout 4)

# The layout backbone on the Llama family (tests/mpi_test_util.h arch_sets: grouped-query
# attention, rotary embeddings, RMSNorm, SwiGLU, untied head): every tensor/data layout with
# sequence parallelism and ZeRO-1, every schedule (interleaved, zb-h1, 2bw against the
# single-process 2bw) against the single-process run.
# Checkpoints reshard the fused q/k/v and gate/up blocks between layouts (mpi_checkpoint_llama).
foreach(target_prefix_nps "mpi_test_parallel;mpi_parallel_llama;2;4"
                          "mpi_test_pipeline;mpi_pipeline_llama;2;4"
                          "mpi_test_checkpoint;mpi_checkpoint_llama;4")
  list(POP_FRONT target_prefix_nps target prefix)
  foreach(np ${target_prefix_nps})
    add_test(NAME ${prefix}_np${np} COMMAND ${STRATA_MPI_RUN} -np ${np} $<TARGET_FILE:${target}>)
    set_tests_properties(${prefix}_np${np} PROPERTIES
      ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=llama" TIMEOUT 900 PROCESSORS ${np}
      LABELS mpi)
  endforeach()
endforeach()
# Two key/value heads for eight query heads at tensor 2: one key/value head per rank, shared by
# four query heads (the layouts of 2 ranks: t2 with and without sp, d2 with and without ZeRO-1).
add_test(NAME mpi_parallel_llama_kv2_np2 COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_parallel>)
set_tests_properties(mpi_parallel_llama_kv2_np2 PROPERTIES
  ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=llama;STRATA_TEST_KV_HEADS=2" TIMEOUT 900
  PROCESSORS 2 LABELS mpi)

# The layout backbone on the mixtures of experts (models/layers/moe.h; STRATA_TEST_ARCH=mixtral:
# renormalised top-k; qwen3_moe: QK-norm, an explicit head size, top-k weights as routed) at 2
# ranks: tensor 2 with and without sequence parallelism, data 2 with and without ZeRO-1, fp32 and
# bf16, against the single-process run with the load-balancing loss; every schedule at pipeline 2
# (interleaved, zb-h1, 2bw against the single-process 2bw) with it too (its statistics cross the
# stages beside the activations: Model::boundary_stats); checkpoints resharded between layouts at
# 4 ranks (pipeline among them). The pipeline and checkpoint runs start from init_std 0.1: at the
# tiny preset's 0.02, Qwen3's QK-norm of near-zero queries (hidden 32, heads of 32) amplifies the
# float32 rounding of another summation order to 1e-4 in the gradient norm after 18 steps
# (measured: 1.4e-7 at 0.1), which is the conditioning of that model, not a layout difference.
set(moe_sets "model.init_std=0.1")
# The checkpoint runs also take AdamW's eps 1e-6 (mpi_test_expert.cc says why): at 1e-8,
# OpenBLAS's Haswell kernels under AddressSanitizer's code end Mixtral's tensor 2 × pipeline 2 run
# 4e-5 from the single process (a near-zero gradient element's rounding, which Adam makes a
# whole step), while SkylakeX's stay within 1e-5.
set(moe_checkpoint_sets "${moe_sets},optimizer.eps=1e-6")
# Expert parallelism (mpi_test_expert.cc) on 4 ranks: expert 2 and 4 alone, with ZeRO-1, with
# tensor 2 and sequence parallelism, bf16, every schedule at pipeline 2, checkpoints resharded
# across expert sizes.
strata_mpi_executable(mpi_test_expert)
foreach(arch mixtral qwen3_moe)
  add_test(NAME mpi_parallel_${arch}_np2
           COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_parallel>
                   --gtest_filter=Parallel.EveryLayout*:Parallel.Bf16*)
  set_tests_properties(mpi_parallel_${arch}_np2 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=${arch}" TIMEOUT 900 PROCESSORS 2 LABELS mpi)
  add_test(NAME mpi_pipeline_${arch}_np2
           COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_pipeline>
                   --gtest_filter=Pipeline.EverySchedule*:Pipeline.TwoBW*)
  set_tests_properties(mpi_pipeline_${arch}_np2 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=${arch};STRATA_TEST_SETS=${moe_sets}"
    TIMEOUT 900 PROCESSORS 2 LABELS mpi)
  add_test(NAME mpi_expert_${arch}_np4 COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_expert>)
  set_tests_properties(mpi_expert_${arch}_np4 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=${arch}" TIMEOUT 900 PROCESSORS 4 LABELS mpi)
  add_test(NAME mpi_checkpoint_${arch}_np4
           COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_checkpoint>)
  set_tests_properties(mpi_checkpoint_${arch}_np4 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=${arch};STRATA_TEST_SETS=${moe_checkpoint_sets}"
    TIMEOUT 900 PROCESSORS 4 LABELS mpi)
endforeach()
# Qwen3-MoE's dense layers (decoder_sparse_step, mlp_only_layers: a dense SwiGLU MLP in the
# mixture's slot) under the same layouts. Expert parallelism on 4 layers with only layer 3 a
# mixture (step 2, layer 1 dense by mlp_only_layers): pipeline 2's first stage holds no expert at
# all, its reductions, ZeRO-1 shards and checkpoints none; every schedule at pipeline 2 on 8
# layers alternating dense and sparse (step 2), the interleaved schedule's single-layer pieces
# either kind, the balancing loss over the 4 mixtures across the stages.
add_test(NAME mpi_expert_qwen3_moe_dense_np4
         COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_expert>)
set_tests_properties(mpi_expert_qwen3_moe_dense_np4 PROPERTIES
  ENVIRONMENT
  "${STRATA_MPI_ENV};STRATA_TEST_ARCH=qwen3_moe;STRATA_TEST_SETS=model.decoder_sparse_step=2,model.mlp_only_layers=[1]"
  TIMEOUT 900 PROCESSORS 4 LABELS mpi)
add_test(NAME mpi_pipeline_qwen3_moe_dense_np2
         COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_pipeline>
                 --gtest_filter=Pipeline.EverySchedule*:Pipeline.TwoBW*)
set_tests_properties(mpi_pipeline_qwen3_moe_dense_np2 PROPERTIES
  ENVIRONMENT
  "${STRATA_MPI_ENV};STRATA_TEST_ARCH=qwen3_moe;STRATA_TEST_SETS=${moe_sets},model.decoder_sparse_step=2"
  TIMEOUT 900 PROCESSORS 2 LABELS mpi)

# The layout backbone on BERT (STRATA_TEST_ARCH=bert: post-norm encoder, bidirectional attention
# over padded keys, the masked-LM head tied to the word embeddings, the pooler and sentence head,
# on masked-LM samples of the synthetic chain's documents): tensor 2 and 4 with sequence
# parallelism, data 2 and 4 with ZeRO-1, fp32 and bf16; every schedule at pipeline 2 and 4
# (interleaved, zb-h1 with sp, recompute), 2bw against the single-process 2bw; checkpoints
# resharded between layouts. The memory, overlap and trace tests stay GPT's and Llama's.
foreach(target_prefix_nps_filter
        "mpi_test_parallel;mpi_parallel_bert;Parallel.EveryLayout*:Parallel.Bf16*;2;4"
        "mpi_test_pipeline;mpi_pipeline_bert;Pipeline.EverySchedule*:Pipeline.TwoBW*;2;4"
        "mpi_test_checkpoint;mpi_checkpoint_bert;*;4")
  list(POP_FRONT target_prefix_nps_filter target prefix filter)
  foreach(np ${target_prefix_nps_filter})
    add_test(NAME ${prefix}_np${np} COMMAND ${STRATA_MPI_RUN} -np ${np} $<TARGET_FILE:${target}>
             --gtest_filter=${filter})
    set_tests_properties(${prefix}_np${np} PROPERTIES
      ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=bert" TIMEOUT 900 PROCESSORS ${np}
      LABELS mpi)
  endforeach()
endforeach()

# `strata generate` against transformers' greedy decoding (issue 26; tests/golden/generate/):
# alone (mpi_generate_np1) and with the model split over two tensor-parallel ranks
# (mpi_generate_tp2: every generate() call takes STRATA_TEST_GENERATE_SETS as --set overrides).
strata_mpi_executable(mpi_test_generate)
target_compile_definitions(mpi_test_generate PRIVATE
                           STRATA_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
strata_mpi_test(mpi_test_generate mpi_generate 1)
add_test(NAME mpi_generate_tp2 COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_generate>)
set_tests_properties(mpi_generate_tp2 PROPERTIES
  ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_GENERATE_SETS=parallel.tensor=2" TIMEOUT 300
  PROCESSORS 2 LABELS mpi)
# Samples during training on the 4-rank layouts (tensor × pipeline, pipeline 4, 2bw at tensor 2);
# the 2-rank layouts run in mpi_generate_tp2.
add_test(NAME mpi_training_samples_np4 COMMAND ${STRATA_MPI_RUN} -np 4
         $<TARGET_FILE:mpi_test_generate> --gtest_filter=TrainingSamples.*)
set_tests_properties(mpi_training_samples_np4 PROPERTIES ENVIRONMENT "${STRATA_MPI_ENV}"
  TIMEOUT 300 PROCESSORS 4 LABELS mpi)

# `strata eval --task` against transformers' log-likelihoods (issue 26; tests/golden/eval/):
# alone and at tensor 2.
strata_mpi_executable(mpi_test_eval)
target_compile_definitions(mpi_test_eval PRIVATE STRATA_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
strata_mpi_test(mpi_test_eval mpi_eval 1)
# Qwen2: Llama's block with q/k/v biases, split by blocks over the tensor group (every tensor
# and data layout of 4 ranks with sequence parallelism and ZeRO-1). (Mistral is Llama's block
# under other names: its golden test checks the names.)
add_test(NAME mpi_parallel_qwen2_np4 COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_parallel>)
set_tests_properties(mpi_parallel_qwen2_np4 PROPERTIES
  ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=qwen2" TIMEOUT 900 PROCESSORS 4 LABELS mpi)

add_test(NAME mpi_eval_tp2 COMMAND ${STRATA_MPI_RUN} -np 2 $<TARGET_FILE:mpi_test_eval>)
set_tests_properties(mpi_eval_tp2 PROPERTIES
  ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_EVAL_SETS=parallel.tensor=2" TIMEOUT 300
  PROCESSORS 2 LABELS mpi)

# Context parallelism (mpi_test_context.cc) on 4 ranks, for GPT-2 (learned positions), Llama
# (rotary, grouped-query attention) and BERT (padded bidirectional attention, sentence head).
strata_mpi_executable(mpi_test_context)
foreach(arch gpt llama bert)
  set(arch_env "")
  if(NOT arch STREQUAL "gpt")
    set(arch_env ";STRATA_TEST_ARCH=${arch}")
  endif()
  add_test(NAME mpi_context_${arch}_np4 COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_context>)
  set_tests_properties(mpi_context_${arch}_np4 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV}${arch_env}" TIMEOUT 900 PROCESSORS 4 LABELS mpi)
endforeach()
# The mixtures of experts under context parallelism (their balancing statistics summed over the
# context group; context × expert parallelism), 6 steps from the tiny presets' init_std as
# mpi_expert's: at moe_sets' 0.1 one element of Qwen3-MoE's embedding (a token seen rarely: a
# near-zero gradient, which Adam's first steps divide by eps) ends 1.2e-5 (5e-4 relative) off
# the single process at context 2 × tensor 2 with sp, while losses agree to 1e-7 and context 1 ×
# tensor 2 stays within 1e-5: the conditioning of the update, not a layout difference.
foreach(arch mixtral qwen3_moe)
  add_test(NAME mpi_context_${arch}_np4
           COMMAND ${STRATA_MPI_RUN} -np 4 $<TARGET_FILE:mpi_test_context>
                   --gtest_filter=Context.MixtureOfExperts*)
  set_tests_properties(mpi_context_${arch}_np4 PROPERTIES
    ENVIRONMENT "${STRATA_MPI_ENV};STRATA_TEST_ARCH=${arch}" TIMEOUT 900 PROCESSORS 4 LABELS mpi)
endforeach()
