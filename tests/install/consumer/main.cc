// Uses the installed headers and library the way a user's program would.
#include <iostream>

#include "tensor/ops.h"

int main() {
  using namespace ringtrain;
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = matmul(a, a.t());  // [[14, 32], [32, 77]]
  std::vector<float> v = b.to_vector<float>();
  if (v != std::vector<float>{14, 32, 32, 77}) {
    std::cerr << "consumer: wrong result " << b << "\n";
    return 1;
  }
  std::cout << "consumer: ok\n";
  return 0;
}
