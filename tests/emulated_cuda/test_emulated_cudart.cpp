// The emulated CUDA runtime (emulated_cudart.cpp): the mix-ups that fault on a GPU (a copy past
// an allocation, a host pointer where device memory belongs, freeing what cudaMalloc did not
// return) fail here too, with a sentence that says which.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

TEST(EmulatedCudart, CopiesMustStayInsideOneAllocationOnTheirDeviceSide) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 10 * sizeof(float)), cudaSuccess);
  std::vector<float> host(11, 1.0f);
  EXPECT_EQ(cudaMemcpy(device, host.data(), 10 * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device + 1, host.data(), 10 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("past its allocation"),
            std::string::npos);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, as CUDA's
  // A host pointer as the device side, and device memory as the host side.
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 5, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(device, device + 5, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(device + 8, 0, 3 * sizeof(float)), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(device + 8, 0, 2 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaErrorInvalidDevicePointer);  // twice
  (void)cudaGetLastError();
}

TEST(EmulatedCudart, ReportsAnSm90DeviceAndRefusesSharedMemoryAboveItsOptInLimit) {
  int major = 0, optin = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  const int kernel_id = 0;
  EXPECT_EQ(cudaFuncSetAttribute(&kernel_id, cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
            cudaSuccess);
  EXPECT_EQ(
      cudaFuncSetAttribute(&kernel_id, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1),
      cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

// Eight devices unless GNMR_EMULATED_DEVICES says otherwise; the current device is the last
// one set, and a device past the count is refused as CUDA refuses it.
TEST(EmulatedCudart, HasEightDevicesOrGnmrEmulatedDevicesAndTracksTheCurrentOne) {
  const char* saved = std::getenv("GNMR_EMULATED_DEVICES");
  const std::string saved_value = saved ? saved : "";
  int count = 0, device = -1;
  unsetenv("GNMR_EMULATED_DEVICES");
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 8);
  EXPECT_EQ(cudaSetDevice(7), cudaSuccess);
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, 7);
  setenv("GNMR_EMULATED_DEVICES", "2", 1);
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidDevice)).find("has 2 devices"),
            std::string::npos);
  cudaDeviceProp prop{};
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  EXPECT_EQ(prop.major, 9);
  setenv("GNMR_EMULATED_DEVICES", "zero", 1);
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("GNMR_EMULATED_DEVICES"),
            std::string::npos);
  if (saved) {
    setenv("GNMR_EMULATED_DEVICES", saved_value.c_str(), 1);
  } else {
    unsetenv("GNMR_EMULATED_DEVICES");
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  (void)cudaGetLastError();
}

}  // namespace
