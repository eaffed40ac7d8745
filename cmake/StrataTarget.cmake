# strata_add_library(NAME DIR DEPS...): a static library of every .cc under DIR, in any
# sub-folder (models/layers/, models/gpt/, launch/train/, …), plus the .cu and .cc files of any
# cuda/ sub-folder when the CUDA backend is on. Sources are globbed recursively so that adding a
# file or a folder (a new model architecture) needs no CMake edit; CONFIGURE_DEPENDS re-globs on
# every build.
#
# CUDA emulation (STRATA_CUDA_EMULATION): the .cu files are compiled as C++, the .cc files of
# cuda/emulation/ folders are added, and each of them replaces the cuda/ file of the same name
# beside it, if any (the cuBLASLt and cuDNN parts, which are not emulated); the others stand in
# for libraries (the CUDA runtime, NCCL).
function(strata_add_library name dir)
  file(GLOB_RECURSE all_srcs CONFIGURE_DEPENDS ${dir}/*.cc ${dir}/*.cu)
  # cuda/ folders are the CUDA backend's, added below only when it is built.
  set(srcs ${all_srcs})
  list(FILTER srcs INCLUDE REGEX ".*\\.cc$")
  list(FILTER srcs EXCLUDE REGEX ".*/cuda/.*")
  if(STRATA_HAVE_CUDA)
    # Files directly inside a cuda/ folder (its emulation/ sub-folder is handled below).
    set(cuda_srcs ${all_srcs})
    list(FILTER cuda_srcs INCLUDE REGEX ".*/cuda/[^/]+$")
    if(STRATA_CUDA_EMULATION)
      set(emulation_srcs ${all_srcs})
      list(FILTER emulation_srcs INCLUDE REGEX ".*/cuda/emulation/[^/]+\\.cc$")
      foreach(e ${emulation_srcs})
        get_filename_component(edir ${e} DIRECTORY)
        get_filename_component(cdir ${edir} DIRECTORY)
        get_filename_component(replaced ${e} NAME)
        list(REMOVE_ITEM cuda_srcs ${cdir}/${replaced})
      endforeach()
      set(cu_srcs ${cuda_srcs})
      list(FILTER cu_srcs INCLUDE REGEX ".*\\.cu$")
      list(APPEND cuda_srcs ${emulation_srcs})
      # #pragma unroll is nvcc's; g++ ignores it.
      set_source_files_properties(${cu_srcs} PROPERTIES LANGUAGE CXX
                                  COMPILE_OPTIONS "-Wno-unknown-pragmas")
    endif()
    list(APPEND srcs ${cuda_srcs})
  endif()
  list(FILTER srcs EXCLUDE REGEX ".*/main\\.cc$")
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} PUBLIC ${ARGN})
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNINGS}>)
    if(STRATA_HAVE_CUDA)
      set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
      target_compile_definitions(${name} PUBLIC STRATA_HAVE_CUDA=1)
    endif()
    if(STRATA_CUDA_EMULATION)
      target_compile_definitions(${name} PUBLIC STRATA_CUDA_EMULATION=1)
    endif()
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} INTERFACE ${ARGN})
  endif()
endfunction()
