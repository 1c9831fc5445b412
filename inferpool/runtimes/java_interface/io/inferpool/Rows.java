package io.inferpool;

/**
 * The server's side of a batch's crossing (not for models): a request's rows arrive as one
 * flat array, which JPype copies as a block, and are split into rows here, where copying
 * a row is one System.arraycopy instead of a Python call.
 */
public final class Rows {
    private Rows() {}

    /** {@code flat} (rows x columns, row after row) as rows of {@code columns} values. */
    public static double[][] split(double[] flat, int columns) {
        double[][] rows = new double[columns == 0 ? 0 : flat.length / columns][columns];
        for (int i = 0; i < rows.length; i++) {
            System.arraycopy(flat, i * columns, rows[i], 0, columns);
        }
        return rows;
    }

    /** {@code flat} (rows x columns, row after row) as rows of {@code columns} values. */
    public static float[][] split(float[] flat, int columns) {
        float[][] rows = new float[columns == 0 ? 0 : flat.length / columns][columns];
        for (int i = 0; i < rows.length; i++) {
            System.arraycopy(flat, i * columns, rows[i], 0, columns);
        }
        return rows;
    }
}
