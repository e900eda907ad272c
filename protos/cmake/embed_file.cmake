# protos/cmake/embed_file.cmake - `cmake -DIN=file -DOUT=file.c -DSYMBOL=name -P embed_file.cmake`
# writes a C file defining `const unsigned char SYMBOL[]` (the bytes of IN) and
# `const size_t SYMBOL_len`. Used to compile the FileDescriptorSet served by reflection into
# the binary.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* generated from ${IN} by protos/cmake/embed_file.cmake; do not edit */\n"
     "#include <stddef.h>\n"
     "const unsigned char ${SYMBOL}[${n} + 1] = {\n${body}0};\n"
     "const size_t ${SYMBOL}_len = ${n};\n")
