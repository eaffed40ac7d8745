# strata_add_library(NAME DIR DEPS...): a static library of every DIR/*.cc (and DIR/cuda/*.cu
# plus DIR/cuda/*.cc when the CUDA backend is on). Sources are globbed so that adding a file
# needs no CMake edit; CONFIGURE_DEPENDS re-globs on every build.
#
# CUDA emulation (STRATA_CUDA_EMULATION): the .cu files are compiled as C++, DIR/cuda/emulation/
# *.cc are added, and each of them replaces the DIR/cuda/ file of the same name, if any (the
# cuBLASLt and cuDNN parts, which are not emulated); the others stand in for libraries (the
# CUDA runtime, NCCL).
function(strata_add_library name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cc ${dir}/cpu/*.cc)
  if(STRATA_HAVE_CUDA)
    file(GLOB cuda_srcs CONFIGURE_DEPENDS ${dir}/cuda/*.cu ${dir}/cuda/*.cc)
    if(STRATA_CUDA_EMULATION)
      file(GLOB emulation_srcs CONFIGURE_DEPENDS ${dir}/cuda/emulation/*.cc)
      foreach(e ${emulation_srcs})
        get_filename_component(replaced ${e} NAME)
        list(REMOVE_ITEM cuda_srcs ${dir}/cuda/${replaced})
      endforeach()
      list(APPEND cuda_srcs ${emulation_srcs})
      file(GLOB cu_srcs CONFIGURE_DEPENDS ${dir}/cuda/*.cu)
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
