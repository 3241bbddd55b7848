# nn/data: zlib for gzip-compressed data files (MNIST *.gz, sklearn's digits.csv.gz).
# Included at the end of nn/CMakeLists.txt, after ringtrain_nn exists.
find_package(ZLIB REQUIRED)
target_link_libraries(ringtrain_nn PRIVATE ZLIB::ZLIB)
