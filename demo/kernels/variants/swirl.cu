/*
 * Tour variant: the same step, now a vortex. A torque around the centre of the
 * box spins the particles up while a weak spring and drag keep them inside;
 * the walls still reflect. Same kernel name, parameters and globals as
 * particles.cu, so hotkern accepts it as a new version of that module.
 */
extern "C" {

__device__ unsigned long long steps;

__global__ void step(float4 *p, int n, float dt, float t) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0)
        steps += 1;
    if (i >= n)
        return;
    float4 q = p[i];
    float dx = q.x - 0.5f, dy = q.y - 0.5f;
    /* Tangential push (the swirl) plus a pull towards the centre. */
    q.z += (-3.0f * dy - 2.0f * dx) * dt;
    q.w += (3.0f * dx - 2.0f * dy) * dt;
    q.z *= 0.99f;
    q.w *= 0.99f;
    q.x += q.z * dt;
    q.y += q.w * dt;
    if (q.x < 0.0f) {
        q.x = -q.x;
        q.z = -q.z;
    }
    if (q.x > 1.0f) {
        q.x = 2.0f - q.x;
        q.z = -q.z;
    }
    if (q.y < 0.0f) {
        q.y = -q.y;
        q.w = -q.w;
    }
    if (q.y > 1.0f) {
        q.y = 2.0f - q.y;
        q.w = -q.w;
    }
    p[i] = q;
}
}
