# Concatenates the files listed in LIST_FILE (paths relative to ROOT, already sorted) into
# OUTPUT: for each file, the byte 0x1E, its relative path, a newline, then its contents.
# Run with: cmake -DROOT=... -DLIST_FILE=... -DOUTPUT=... -P embedded_corpus.cmake
foreach(var ROOT LIST_FILE OUTPUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embedded_corpus.cmake: -D${var}=... is required")
  endif()
endforeach()
string(ASCII 30 record_separator)
file(STRINGS "${LIST_FILE}" relative_paths)
set(blob "")
foreach(relative_path IN LISTS relative_paths)
  file(READ "${ROOT}/${relative_path}" content)
  string(APPEND blob "${record_separator}${relative_path}\n${content}")
endforeach()
file(WRITE "${OUTPUT}.tmp" "${blob}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
